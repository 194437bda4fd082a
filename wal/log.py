"""The segmented write-ahead log and its group commit.

Durability, precisely:

* ``sync="always"`` (default): :meth:`Log.append` returns only after an
  ``fdatasync`` (``fsync`` when the file grew) that covers its record.
  Concurrent appenders share it: the first waiting thread leads, frames every
  queued record, writes them with one ``pwrite`` and syncs once; the others
  wait and return together (LevelDB's writer queue).
* ``sync="batch"``: append returns once the write reached the OS; a background
  flusher syncs every ``sync_interval`` ms or ``sync_bytes``; :meth:`sync`
  forces it. A crash of the process loses nothing; a crash of the machine may
  lose what was appended since the last sync.
* ``sync="none"``: the OS decides when data reaches the disk. Safe against a
  crash of the process, not of the machine. :meth:`sync` and :meth:`close` sync.

:meth:`Log.append_nowait` does the same without blocking: it returns the LSN at
once and calls ``callback(lsn, error)`` from the committing thread when the
entry is acknowledged under the mode above, so one event loop can have
thousands of appends share each fsync without a thread each.

``last_lsn`` is the last LSN appended, ``durable_lsn`` the last one fsynced.
Readers see entries up to ``durable_lsn`` unless they ask otherwise; readers
in other processes get it from the ``DURABLE`` file (:mod:`wal.segment`).

A failed write or fsync (a full disk included) fails the log: every later
append raises :class:`LogFailedError` (retrying an fsync and trusting the data
is wrong after the kernel may have dropped the dirty pages). Nothing
acknowledged before is lost; reopen to go on. Its message states what is
durable, what was acknowledged, and what may or may not be there
(:func:`wal.errors.log_failed`).

A log whose directory is deleted or replaced under it (``rm -rf``) fails with
:class:`~wal.errors.StoreVanishedError` instead of writing into deleted
files: the lock's device and inode are checked (:meth:`DirectoryLock.check`)
at each segment roll, each :meth:`Log.sync` (so every flush of
``sync="batch"``), at :meth:`Log.close`, when a snapshot is taken
(:meth:`Log.check_directory`), and at most every
:data:`DIRECTORY_CHECK_US` microseconds of appends; so appends are refused
at the latest about a second after the directory vanished, or at the next
roll or sync. Nothing recreates it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Self, cast

from wal.commit import Callback, Group, GroupCommit
from wal.durable import DurableMarker
from wal.errors import (
    ClosedError,
    LogFailedError,
    RecordTooLargeError,
    file_error,
    log_failed,
)
from wal.flusher import BatchFlusher
from wal.forkguard import Refusing, track
from wal.fs import OS_FS, FileSystem
from wal.index import SparseIndex
from wal.lock import DirectoryLock
from wal.log_sync import LogSync
from wal.reader import LogReading
from wal.record import DEFAULT_MAX_RECORD_BYTES, MAX_RECORD_LIMIT
from wal.recovery import recover
from wal.segment import ENTRY_HEADER_SIZE, Payload, SegmentFile, payload_size
from wal.segment_writer import ActiveSegment, gathered, round_block
from wal.stats import LogStats
from wal.truncation import LogTruncation

logger = logging.getLogger("walkv.wal")

SYNC_MODES = ("always", "batch", "none")
DEFAULT_SEGMENT_BYTES = 64 << 20
PREALLOC_STEP = 8 << 20
DIRECTORY_CHECK_US = 1_000_000  # appends check that the directory is still there at least this often
CommitHook = Callable[[Group], None]
PrepareHook = Callable[[Group], "list[Payload] | None"]


class Log(LogReading, LogTruncation, LogSync):
    """One log directory, opened by its one writer. Use :func:`wal.open`.

    Options: ``sync`` (see the module docstring); ``segment_bytes``, the size
    at which a segment is sealed and the next begun; ``sync_interval`` (ms) and
    ``sync_bytes`` for ``sync="batch"``; ``recovery`` ("strict" refuses to open
    a corrupt log, "prefix" keeps its longest valid prefix); ``on_commit``,
    called with each :class:`~wal.commit.Group` (LSNs, payloads and the
    contexts their appenders passed) after it is acknowledged and before its
    appenders return; ``on_prepare``, called with each group by its leader
    just before it is framed (the previous group is written and committed by
    then), returning the payloads to write instead (same number, same LSNs)
    or ``None`` to write them as they are: the layer above decides what
    depends on the order of the log there; ``max_record_bytes``, the
    bound on one entry (at most :data:`~wal.record.MAX_RECORD_LIMIT`, 1 GiB;
    each segment's header states the limit it was written with, which is
    what readers go by); ``start_lsn``, the first LSN of a log created empty
    (a restored store continues its LSNs); ``fs``, the file-system seam
    (tests inject faults through it).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        sync: str = "always",
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        sync_interval: float = 50.0,
        sync_bytes: int = 1 << 20,
        recovery: str = "strict",
        on_commit: CommitHook | None = None,
        on_prepare: PrepareHook | None = None,
        fs: FileSystem | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        start_lsn: int = 1,
    ) -> None:
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {SYNC_MODES}, not {sync!r}")
        if not isinstance(segment_bytes, int) or segment_bytes < 1024:
            raise ValueError(f"segment_bytes must be an int of at least 1024, not {segment_bytes!r}")
        for name, value, low in (("sync_interval", sync_interval, 0.1), ("sync_bytes", sync_bytes, 1),
                                 ("max_record_bytes", max_record_bytes, 64)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
                raise ValueError(f"{name} must be a number of at least {low}, not {value!r}")
        if max_record_bytes > MAX_RECORD_LIMIT:
            raise ValueError(f"max_record_bytes must be at most {MAX_RECORD_LIMIT} (1 GiB), not {max_record_bytes!r}")
        self.directory = os.fspath(directory)
        self.sync_mode = sync
        self.segment_bytes = segment_bytes
        self.sync_interval = sync_interval
        self.sync_bytes = sync_bytes
        self.max_record_bytes = max_record_bytes
        self._max_payload = max_record_bytes - ENTRY_HEADER_SIZE
        self._on_commit = on_commit
        self._on_prepare = on_prepare
        self._fs = fs or OS_FS
        self._prealloc_step = min(PREALLOC_STEP, round_block(segment_bytes))
        if not isinstance(start_lsn, int) or start_lsn < 1:
            raise ValueError(f"start_lsn must be a positive int, not {start_lsn!r}")
        self._start_lsn = start_lsn

        try:
            self._fs.makedirs(self.directory)
            self._lock = DirectoryLock(self.directory, f"the log at {self.directory}")
        except OSError as e:
            raise file_error(e, f"opening the log at {self.directory}") from None
        try:
            self._open_state(recovery)
        except OSError as e:
            self._lock.release()
            raise file_error(e, f"opening the log at {self.directory}") from None
        except BaseException:
            self._lock.release()
            raise

        self._closed = False
        self._failure: LogFailedError | None = None
        self._checked_us = time.time_ns() // 1000  # when the directory was last found in place
        self._gc = GroupCommit(self._write_group, self._fail, self._refuse, self._last_at_open + 1)
        self._flusher: BatchFlusher | None = None
        self._unsynced_bytes = 0
        self._stats = LogStats()
        if sync == "batch":
            self._flusher = BatchFlusher(self._gc.mutex, sync_interval / 1000.0, self.sync)
        self._pid = os.getpid()
        track(self)

    def _after_fork_in_child(self) -> None:
        """In a forked child (:mod:`wal.forkguard`): every use raises
        ForkedError, close() touches nothing of the parent's."""
        if self._closed:
            return
        self._closed = True
        self._gc = Refusing(f"the log at {self.directory}", self._pid)  # type: ignore[assignment]

    # -- opening -------------------------------------------------------------

    def _open_state(self, recovery: str) -> None:
        rec = recover(self.directory, fs=self._fs, mode=recovery, prealloc=self._prealloc_step,
                      max_record_bytes=self.max_record_bytes, start_lsn=self._start_lsn)
        self.store_id = rec.store_id
        self.dropped_bytes_at_open = rec.dropped_bytes
        self._sealed: list[SegmentFile] = [s.file for s in rec.sealed]
        self._indexes: dict[int, SparseIndex] = {s.file.first_lsn: s.index for s in rec.sealed}
        self._active = rec.active
        self._active.open(self._fs, self._prealloc_step)
        self._active.sync_full()  # what a crashed process left in the page cache
        last = rec.active.last_lsn
        self._last_at_open = last
        self._written = (last, rec.active.data_end)
        self._durable = self._written
        self._first_lsn = self._sealed[0].first_lsn if self._sealed else rec.active.file.first_lsn
        self._durable_marker = DurableMarker(self.directory)
        self._publish_durable()

    def _publish_durable(self) -> None:
        self._durable_marker.publish(self._durable[0])

    # -- properties ----------------------------------------------------------

    @property
    def first_lsn(self) -> int:
        """The first LSN the log still holds (1 until truncate_before)."""
        return self._first_lsn

    @property
    def last_lsn(self) -> int:
        """The last LSN appended (0 for an empty log)."""
        return self._gc.next_lsn - 1

    @property
    def durable_lsn(self) -> int:
        """The last LSN known to be on disk (fsynced)."""
        return self._durable[0]

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failure(self) -> LogFailedError | None:
        """The error the log failed with (it refuses appends), or None."""
        return self._failure

    @property
    def appended_bytes(self) -> int:
        """Bytes of log written since this log object was opened (cheap: for
        policies such as "snapshot every N bytes of log")."""
        return self._stats.bytes

    # -- appending -------------------------------------------------------------

    def _check(self, payload: object) -> Payload:
        if type(payload) is tuple and all(type(p) is bytes for p in payload):
            payload = cast("tuple[bytes, ...]", payload)  # pieces, logged without being joined
        elif type(payload) is not bytes:
            if not isinstance(payload, (bytearray, memoryview)):
                raise TypeError(f"log payload must be bytes (or a tuple of bytes), not {type(payload).__name__}")
            payload = bytes(payload)
        size = payload_size(payload)
        if size > self._max_payload:
            raise RecordTooLargeError(
                f"log entry of {size} bytes is over the limit of {self._max_payload} bytes "
                f"(max_record_bytes={self.max_record_bytes}); nothing was written"
            )
        return payload

    def _refuse(self) -> None:
        if self._closed:
            raise ClosedError(f"the log at {self.directory} is closed; open it again to append")
        if self._failure is not None:
            raise self._failure

    def append(self, payload: Payload, context: object = None) -> int:
        """Append one entry; return its LSN. Durable on return when
        ``sync="always"``, written to the OS otherwise. ``context`` is handed
        to ``on_commit`` with the payload (the log never looks at it).
        ``payload`` is bytes, or a tuple of bytes whose concatenation is the
        payload: a large value is then logged without being copied into one
        buffer (``on_commit`` gets the tuple)."""
        if type(payload) is not bytes or len(payload) > self._max_payload:
            payload = self._check(payload)
        return self._gc.submit([payload], [context])

    def append_batch(self, payloads: Iterable[bytes]) -> tuple[int, int]:
        """Append several entries, written as one group; return ``(first,
        last)`` LSNs. Durability as :meth:`append`, for all of them at once
        (a crash may keep a prefix of them)."""
        items = [self._check(p) for p in payloads]
        if not items:
            raise ValueError("append_batch needs at least one payload")
        first = self._gc.submit(items, [None] * len(items))
        return first, first + len(items) - 1

    def append_nowait(self, payload: bytes, callback: Callback, context: object = None) -> int:
        """Queue one entry without blocking; return its LSN. ``callback(lsn,
        error)`` runs on the committing thread once the entry is acknowledged
        (durable when ``sync="always"``), or with the error that failed it. It
        must be quick and must not call back into the log. ``context`` as for
        :meth:`append`."""
        return self._gc.submit_nowait([self._check(payload)], [context], callback)

    def append_many_nowait(self, payloads: Sequence[Payload], callback: Callback,
                           contexts: Sequence[object]) -> int:
        """Queue several entries (``contexts[i]`` goes with ``payloads[i]``)
        without blocking; return the first LSN (the others follow in order).
        ``callback(first, error)`` runs once, as for :meth:`append_nowait`,
        when all of them are acknowledged (they are always in one group), or
        failed together. Nothing is queued when one payload is refused."""
        if len(payloads) != len(contexts) or not payloads:
            raise ValueError("append_many_nowait needs as many contexts as payloads, and at least one")
        check, limit = self._check, self._max_payload
        items = [p if type(p) is bytes and len(p) <= limit else check(p) for p in payloads]
        return self._gc.submit_nowait(items, contexts, callback)

    def _fail(self, error: BaseException, first_lsn: int) -> LogFailedError:
        if self._failure is not None:
            return self._failure
        self._failure = log_failed(self.directory, error, first_lsn, self._durable[0], self._written[0])
        self._failure.__cause__ = error
        logger.error("%s", self._failure)
        return self._failure

    def _write_group(self, group: Group) -> None:
        """Frame, write and (when ``sync="always"``) sync one group, then hand
        it to ``on_commit``. Called by the leader only, without the mutex."""
        if self._on_prepare is not None:
            prepared = self._on_prepare(group)
            if prepared is not None:
                group = group._replace(payloads=[self._check(p) for p in prepared])
        first, payloads = group.first_lsn, group.payloads
        active = self._active
        now_us = time.time_ns() // 1000
        if active.data_end >= self.segment_bytes and active.last_lsn >= active.file.first_lsn:
            self._roll(first)
            active = self._active
        elif abs(now_us - self._checked_us) >= DIRECTORY_CHECK_US:
            self._lock.check()
            self._checked_us = now_us
        written, grew = active.write_group(first, payloads, now_us, gathered(payloads))
        lsn = first + len(payloads)
        self._written = (lsn - 1, active.data_end)
        if self.sync_mode == "always":
            self._timed_sync(full=grew)
            self._durable = self._written
            self._durable_marker.publish(lsn - 1)
        else:
            self._unsynced_bytes += written
            if self._flusher is not None and self._unsynced_bytes >= self.sync_bytes:
                with self._gc.mutex:
                    self._flusher.poke()
        self._stats.group(len(payloads), written)
        if self._on_commit is not None:
            self._on_commit(group)

    def _timed_sync(self, full: bool = False) -> None:
        self._stats.timed(self._active.sync_full if full else self._active.sync)
        self._unsynced_bytes = 0

    def _roll(self, first: int) -> None:
        """Seal the active segment (cut its zeros, fsync, write its index) and
        start a new one whose first LSN is ``first`` (never in a directory
        that is not the one opened: :class:`StoreVanishedError`)."""
        self._lock.check()
        self._checked_us = time.time_ns() // 1000
        old = self._active
        index = old.seal(self._fs, self._timed_sync)
        new = ActiveSegment.create(self.directory, self.store_id, first, self._prealloc_step, self._fs,
                                   self.max_record_bytes)
        new.open(self._fs, self._prealloc_step)
        with self._gc.mutex:  # readers copy the segment list under it
            self._sealed.append(old.file)
            self._indexes[old.file.first_lsn] = index
            self._active = new
            self._written = self._durable = (first - 1, new.data_end)
        old.close()
        self._publish_durable()
        self._stats.rolls += 1

    # -- stats -------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, float | int | str]:
        """Counters and latencies: appends, bytes, groups, fsyncs, fsync
        latency p50/p99 (ms, over the last 4096), group sizes, segments."""
        with self._gc.mutex:
            st = self._stats.report()
            st.update(first_lsn=self._first_lsn, last_lsn=self._gc.next_lsn - 1, durable_lsn=self._durable[0],
                      segments=len(self._sealed) + 1, sync=self.sync_mode,
                      dropped_bytes_at_open=self.dropped_bytes_at_open)
        return st

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"LSN {self.first_lsn}..{self.last_lsn}, durable {self.durable_lsn}"
        return f"<wal.Log {self.directory!r} sync={self.sync_mode} {state}>"


def open(directory: str | os.PathLike[str], **options: object) -> Log:
    """Open (or create) the log in ``directory`` for writing. See :class:`Log`."""
    return Log(directory, **options)  # type: ignore[arg-type]  # Log.__init__ checks each option's type at run time
