"""The segmented write-ahead log and its group commit.

Durability, precisely:

* ``sync="always"`` (default): :meth:`Log.append` returns only after an
  ``fdatasync`` (``fsync`` when the file grew) that covers its record.
  Concurrent appenders share it: the first waiting thread leads, frames every
  queued record, writes them with one ``pwrite`` and syncs once; the others
  wait and return together (LevelDB's writer queue). An appender that finds
  nobody writing writes its own record at once (the same write and sync, no
  queue: :meth:`wal.commit.GroupCommit.submit`).
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
(:func:`wal.failures.log_failed`).

A log whose directory is deleted or replaced under it (``rm -rf``) fails with
:class:`~wal.errors.StoreVanishedError` instead of writing into deleted
files: the lock's device and inode are checked (:meth:`DirectoryLock.check`)
with ``sync="always"`` after each group's fsync, before it is acknowledged,
so no acknowledged write is in a directory gone from the path; else at most
every :data:`~wal.log_writer.DIRECTORY_CHECK_US` microseconds of appends
(they promise no fsync). Also at each roll, each
:meth:`Log.sync` (every flush of ``sync="batch"``), :meth:`Log.close` and
snapshot (:meth:`Log.check_directory`). Nothing recreates it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Final, Self

from mypy_extensions import mypyc_attr

from wal.append import Appender
from wal.commit import Callback, GroupCommit
from wal.crc import BytesLike
from wal.errors import ClosedError, LogFailedError, OutcomeUnknownError, StoreVanishedError
from wal.failures import file_error, log_failed
from wal.flusher import BatchFlusher
from wal.forkguard import Refusing, track
from wal.fs import OS_FS, FileSystem
from wal.group import Group
from wal.hooks import CallableHooks, CommitHook, LogHooks, PrepareHook, StageHook
from wal.log_writer import LogWriter
from wal.mutex import Mutex
from wal.reader import entries_of
from wal.record import DEFAULT_MAX_RECORD_BYTES, MAX_RECORD_LIMIT
from wal.segment import ENTRY_HEADER_SIZE, Entry, EntryBatch, Payload
from wal.segment_writer import check_payload
from wal.timeline import ROOT, History, TimelineStart, check_history, history_after_cut, timeline_from
from wal.truncation import delete_segments

logger = logging.getLogger("walkv.wal")

SYNC_MODES: Final = ("always", "batch", "none")
DEFAULT_SEGMENT_BYTES: Final = 64 << 20
_LSN_AND_PAYLOAD: Final = itemgetter(0, 2)


@mypyc_attr(native_class=False)  # wal.forkguard holds it weakly: compiled classes take no weak references
class Log:
    """One log directory, opened by its one writer. Use :func:`wal.open`.

    Options: ``sync`` (see the module docstring); ``segment_bytes``, the size
    at which a segment is sealed and the next begun; ``sync_interval`` (ms) and
    ``sync_bytes`` for ``sync="batch"``; ``recovery`` ("strict" refuses to open
    a corrupt log, "prefix" keeps its longest valid prefix); ``hooks``, what
    the layer above does with each :class:`~wal.group.Group` the log writes
    (LSNs, payloads and the contexts their appenders passed): a
    :class:`~wal.hooks.LogHooks` whose ``prepare``, ``stage`` and ``commit``
    the log's leader calls before the group is framed, before it is written, and
    once it is acknowledged, before its appenders return (:mod:`wal.hooks`
    says what each may do), or instead any of ``on_prepare``, ``on_stage``
    and ``on_commit``, plain callables for the same; ``max_record_bytes``, the
    bound on one entry (at most :data:`~wal.record.MAX_RECORD_LIMIT`, 1 GiB;
    each segment's header states the limit it was written with, which is
    what readers go by); ``start_lsn``, the first LSN of a log created empty
    (a restored store continues its LSNs), ``history`` its timeline history
    (:mod:`wal.timeline`; default: timeline 1) and ``store_id`` its store id
    (default: a new one); ``fs``, the file-system seam (tests inject faults
    through it).

    It has a :class:`~wal.commit.GroupCommit`, the appenders' queue, whose
    leader writes through the :class:`~wal.log_writer.LogWriter` (the lock,
    the segments, what is durable), and with ``sync="batch"`` a flusher.
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
        hooks: LogHooks | None = None,
        on_commit: CommitHook | None = None,
        on_prepare: PrepareHook | None = None,
        on_stage: StageHook | None = None,
        fs: FileSystem | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        start_lsn: int = 1,
        history: History = ROOT,
        store_id: str | None = None,
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
        if not isinstance(start_lsn, int) or start_lsn < 1:
            raise ValueError(f"start_lsn must be a positive int, not {start_lsn!r}")
        check_history(history)
        if hooks is None:
            hooks = CallableHooks(on_prepare, on_stage, on_commit)
        elif on_prepare is not None or on_stage is not None or on_commit is not None:
            raise ValueError("pass the log's hooks either as hooks= or as on_prepare=/on_stage=/on_commit=, not both")
        self.directory = os.fspath(directory)
        self.sync_mode = sync
        self.segment_bytes = segment_bytes
        self.sync_interval = sync_interval
        self.sync_bytes = sync_bytes
        self.max_record_bytes = max_record_bytes
        self._max_payload = max_record_bytes - ENTRY_HEADER_SIZE
        mutex = Mutex()  # the group commit's; readers copy the writer's state under it
        try:
            self._writer = w = LogWriter(
                self.directory, fs or OS_FS, mutex, recovery=recovery, sync_mode=sync, segment_bytes=segment_bytes,
                sync_bytes=sync_bytes, max_record_bytes=max_record_bytes, start_lsn=start_lsn, hooks=hooks,
                history=history, store_id=store_id)
        except OSError as e:
            raise file_error(e, f"opening the log at {self.directory}") from None
        self._failure: LogFailedError | None = None
        # Appends call the group commit as a GroupCommit (compiled: a direct call); everything
        # else reaches it as _gc, which turns Refusing in a forked child (a declared type that
        # mypyc checks at run time, so it says so), and the group commit refuses appends itself.
        self._appends = GroupCommit(w, self._fail, self._refuse, w.written[0] + 1, mutex)
        self._gc: GroupCommit | Refusing = self._appends
        self.appender = Appender(self._appends, max_record_bytes)
        """What :meth:`append` runs: ``log.appender.append`` is the same call, compiled (:mod:`wal.append`)."""
        self._flusher = w.flusher = BatchFlusher(mutex, sync_interval / 1000.0, self.sync) if sync == "batch" else None
        self._pid = os.getpid()
        track(self)

    def _after_fork_in_child(self) -> None:
        """In a forked child (:mod:`wal.forkguard`): every use raises
        ForkedError, close() touches nothing of the parent's."""
        if self._appends.closed:
            return
        self._appends.closed = True
        self._gc = Refusing(f"the log at {self.directory}", self._pid)
        self._appends.refuse_in_fork(f"the log at {self.directory}", self._pid)

    # -- properties ----------------------------------------------------------

    @property
    def store_id(self) -> str:
        """The id every segment of this log carries."""
        return self._writer.files.store_id

    @property
    def history(self) -> History:
        """The log's timeline history, oldest first (:mod:`wal.timeline`)."""
        return self._writer.files.history

    @property
    def timeline(self) -> TimelineStart:
        """The timeline the next entry goes on (the history's last)."""
        return self._writer.files.history[-1]

    @property
    def dropped_bytes_at_open(self) -> int:
        """The bytes of a torn tail the last open cut."""
        return self._writer.files.dropped_bytes

    @property
    def first_lsn(self) -> int:
        """The first LSN the log still holds (1 until truncate_before)."""
        return self._writer.files.first_lsn

    @property
    def last_lsn(self) -> int:
        """The last LSN appended (0 for an empty log)."""
        return self._gc.next_lsn - 1

    @property
    def durable_lsn(self) -> int:
        """The last LSN known to be on disk (fsynced)."""
        return self._writer.durable[0]

    @property
    def closed(self) -> bool:
        return self._appends.closed

    @property
    def failure(self) -> LogFailedError | None:
        """The error the log failed with (it refuses appends), or None."""
        return self._failure

    @property
    def appended_bytes(self) -> int:
        """Bytes of log written since this log object was opened (cheap: for
        policies such as "snapshot every N bytes of log")."""
        return self._writer.stats.bytes

    # -- appending -------------------------------------------------------------

    def _refuse(self) -> None:
        if self._appends.closed:
            raise ClosedError(f"the log at {self.directory} is closed; open it again to append")
        if self._failure is not None:
            raise self._failure

    def append(self, payload: Payload | BytesLike, context: object = None) -> int:
        """Append one entry; return its LSN. Durable on return when
        ``sync="always"``, written to the OS otherwise. ``context`` is handed
        to the hooks' ``commit`` with the payload (the log never looks at it).
        ``payload`` is bytes, or a tuple of bytes whose concatenation is the
        payload: a large value is then logged without being copied into one
        buffer (the hooks get the tuple)."""
        return self.appender.append(payload, context)

    def append_batch(self, payloads: Iterable[Payload | BytesLike]) -> tuple[int, int]:
        """Append several entries, written as one group; return ``(first,
        last)`` LSNs. Durability as :meth:`append`, for all of them at once
        (a crash may keep a prefix of them)."""
        items = [check_payload(p, self.max_record_bytes) for p in payloads]
        if not items:
            raise ValueError("append_batch needs at least one payload")
        first = self._appends.submit(items, [None] * len(items))
        return first, first + len(items) - 1

    def append_nowait(self, payload: Payload | BytesLike, callback: Callback, context: object = None) -> int:
        """Queue one entry without blocking; return its LSN. ``callback(lsn,
        error)`` runs on the committing thread once the entry is acknowledged
        (durable when ``sync="always"``), or with the error that failed it. It
        must be quick and must not call back into the log. ``context`` as for
        :meth:`append`."""
        return self._appends.submit_nowait([check_payload(payload, self.max_record_bytes)], [context], callback)

    def append_many_nowait(self, payloads: Sequence[Payload | BytesLike], callback: Callback,
                           contexts: Sequence[object]) -> int:
        """Queue several entries (``contexts[i]`` goes with ``payloads[i]``)
        without blocking; return the first LSN (the others follow in order).
        ``callback(first, error)`` runs once, as for :meth:`append_nowait`,
        when all of them are acknowledged (they are always in one group), or
        failed together. Nothing is queued when one payload is refused."""
        if len(payloads) != len(contexts) or not payloads:
            raise ValueError("append_many_nowait needs as many contexts as payloads, and at least one")
        limit, record_limit = self._max_payload, self.max_record_bytes
        items = [p if type(p) is bytes and len(p) <= limit else check_payload(p, record_limit) for p in payloads]
        return self._appends.submit_nowait(items, contexts, callback)

    def refuse_appends(self, error: BaseException | None) -> None:
        """While ``error`` is set, every append raises it (and nothing is
        written); None: appends are taken again. A follower's store refuses
        its own writers this way while :meth:`append_replicated` (and sync,
        truncate) go on."""
        with self._gc.mutex:
            self._appends.refusal = error

    def append_replicated(self, entries: Sequence[Entry], contexts: Sequence[object]) -> int:
        """Write entries another log wrote (a leader's, read by its follower)
        with their own LSNs and commit times, as one group (``contexts[i]``
        goes with ``entries[i]`` to the hooks; ``prepare`` is not called:
        whatever the log's order decides, the other log decided, and its
        entries carry the decision). The first must be this log's next LSN and
        the rest follow it; nothing else is appended meanwhile. Durable on
        return as :meth:`append`; returns the first LSN."""
        if not entries or len(entries) != len(contexts):
            raise ValueError("append_replicated needs entries, and as many contexts")
        with self._gc.exclusive(freeze=True):
            first = self._gc.next_lsn
            if [e.lsn for e in entries] != list(range(first, first + len(entries))):
                raise ValueError(f"replicated entries must be LSNs {first}.. in order (this log's next is {first}), "
                                 f"not {entries[0].lsn}..{entries[-1].lsn}")
            limit = self.max_record_bytes
            group = Group(first, [check_payload(e.payload, limit) for e in entries], list(contexts))
            try:
                self._writer.write_group(group, [e.timestamp_us for e in entries])
            except BaseException as e:  # noqa: BLE001 - any failure here fails the log
                raise self._gc.fail(e, first) from e
            self._gc.renumber(first + len(entries))
        return first

    def _fail(self, error: BaseException, first_lsn: int) -> LogFailedError:
        if self._failure is not None:
            return self._failure
        w = self._writer
        if isinstance(error, LogFailedError) and isinstance(error, OutcomeUnknownError):
            # the layer above's own, which says what it knows (a write its replicas or its lease did not confirm)
            self._failure = error
            logger.error("%s", error)
            return error
        self._failure = log_failed(self.directory, error, first_lsn, w.durable[0], w.written[0])
        self._failure.__cause__ = error
        logger.error("%s", self._failure)
        return self._failure

    # -- reading ---------------------------------------------------------------

    def read(self, from_lsn: int = 1, to_lsn: int | None = None, *, durable_only: bool = True
             ) -> Iterator[tuple[int, bytes]]:
        """Yield ``(lsn, payload)`` from ``from_lsn`` to ``to_lsn`` (inclusive),
        up to the durable LSN (or everything written, ``durable_only=False``)."""
        return map(_LSN_AND_PAYLOAD, self.read_entries(from_lsn, to_lsn, durable_only=durable_only))

    def read_entries(self, from_lsn: int = 1, to_lsn: int | None = None, *, durable_only: bool = True
                     ) -> Iterator[Entry]:
        """As :meth:`read`, yielding :class:`wal.Entry` (lsn, timestamp_us, payload)."""
        return entries_of(self._read_batches(from_lsn, to_lsn, durable_only))

    def _read_batches(self, from_lsn: int, to_lsn: int | None, durable_only: bool) -> Iterator[EntryBatch]:
        """:meth:`read_entries`, a block of entries at a time: the segments are
        copied under the mutex (:meth:`SegmentSet.copy`), then read without it."""
        with self._gc.mutex:
            if self._appends.closed:
                raise ClosedError(f"the log at {self.directory} is closed")
            w = self._writer
            limit = w.durable if durable_only else w.written
            view = w.files.copy()
        yield from view.batches(from_lsn, to_lsn, limit, self.directory)

    # -- truncating (crash-safe as :mod:`wal.truncation` says) ------------------

    def truncate_before(self, lsn: int) -> int:
        """Delete whole segments all of whose LSNs are below ``lsn`` (never the
        active one); return the bytes freed. Oldest first, index before
        segment, then a directory fsync: a crash leaves a gap-free suffix."""
        with self._gc.mutex:
            self._refuse()
            doomed = self._writer.files.drop_before(lsn)
        return delete_segments(self.directory, doomed, self._writer.fs) if doomed else 0

    def truncate_after(self, lsn: int, *, follow: History | None = None) -> TimelineStart | None:
        """Drop every entry after ``lsn``; the next append gets ``lsn + 1``, on
        a new timeline (:mod:`wal.timeline`): the next number, or, with
        ``follow`` (a leader's history, which must agree with this log's up to
        ``lsn``: a follower dropping what it holds past the fork), the line
        ``follow`` takes from ``lsn + 1``. Returns the timeline the log goes
        on on, or None when there was nothing after ``lsn``. With ``follow``
        and nothing after ``lsn`` (the last LSN), a timeline this log began
        there but wrote nothing on (a leader killed before its first write)
        is given up for ``follow``'s line the same way. Crash-safe: a
        ``TRUNCATE`` marker stating both is made durable first, and an
        interrupted truncation is finished by the next open."""
        first = self.first_lsn
        if lsn < first - 1 or lsn < 0:
            raise ValueError(f"cannot truncate after LSN {lsn}: the log starts at LSN {first}")
        with self._gc.exclusive(freeze=True):
            history = history_after_cut(self._writer.files.history, lsn, self._gc.next_lsn - 1, follow)
            if history is None:
                return None
            try:
                self._writer.cut_after(lsn, history)
            except OSError as e:
                raise self._gc.fail(e, lsn + 1) from e
            self._gc.renumber(lsn + 1)
        logger.warning("%s: entries after LSN %d dropped; the log goes on on %s", self.directory, lsn, history[-1])
        return history[-1]

    def start_timeline(self, number: int | None = None, *, timeline: TimelineStart | None = None) -> TimelineStart:
        """Go on on a new timeline from the next LSN (a promote, a failover: the
        history changes course here) and return it: ``timeline`` as given (a
        follower takes its leader's), or one numbered ``number`` (an
        election's epoch) or the next number. Durable on return: its segment
        is created and fsynced before anything is written on it."""
        with self._gc.exclusive():
            self._refuse()
            start = timeline_from(self._writer.files.history, self._gc.next_lsn, timeline, number)
            try:
                self._writer.begin_timeline(start)
            except OSError as e:
                raise self._gc.fail(e, start.first_lsn) from e
        logger.info("%s: from LSN %d on %s", self.directory, start.first_lsn, start)
        return start

    # -- syncing and closing: each waits its turn behind the group being written

    def _check_lock(self, first_lsn: int) -> None:
        """Fail the log (from ``first_lsn``) if its directory vanished: nothing
        is made "durable" in files that are no longer at the log's path."""
        try:
            self._writer.lock.check()
        except StoreVanishedError as e:
            raise self._gc.fail(e, first_lsn) from e

    def check_directory(self) -> None:
        """Raise :class:`StoreVanishedError` (and fail the log) when its
        directory or lock file was deleted or replaced since it was opened;
        raise the log's failure if it already failed that way. For callers
        about to write beside the log (snapshots)."""
        if isinstance(self._failure, StoreVanishedError):
            raise self._failure
        self._check_lock(self._writer.written[0] + 1)

    def sync(self) -> int:
        """Make everything appended so far durable; return the durable LSN.
        Checks first that the directory is still the one opened."""
        w = self._writer
        with self._gc.exclusive():
            self._check_lock(w.durable[0] + 1)
            try:
                w.sync()
            except OSError as e:
                raise self._gc.fail(e, w.durable[0] + 1) from e
        return w.durable[0]

    def close(self) -> None:
        """Write what is queued, sync everything, write the active segment's
        index (so the next open scans little) and release the lock.
        Idempotent. After a failure it only releases, except that a log
        whose directory vanished (found now or before) raises
        :class:`StoreVanishedError`: nothing of it could be made durable."""
        if self._appends.closed:
            return
        w = self._writer
        error: OSError | None = None
        vanished: BaseException | None = self._failure if isinstance(self._failure, StoreVanishedError) else None
        try:
            if self._failure is None:
                with self._gc.exclusive():
                    self._appends.closed = True  # refuses appends from here on
                    try:
                        w.lock.check()
                    except StoreVanishedError as e:
                        vanished = self._gc.fail(e, w.written[0] + 1)
                        raise vanished from e
                    w.finish()
        except OSError as e:
            error = e
        except StoreVanishedError:
            pass  # raised below, once everything is released
        finally:
            with self._gc.mutex:
                self._appends.closed = True
            if self._flusher is not None:
                self._flusher.stop()
            self._gc.stop(self._failure or ClosedError("the log was closed before this entry was written"))
            w.close()
        if vanished is not None:
            raise vanished
        if error is not None:
            raise w.close_failed(error) from error

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- stats -------------------------------------------------------------------

    def stats(self) -> dict[str, float | int | str]:
        """Counters and latencies: appends, bytes, groups, fsyncs, fsync
        latency p50/p99 (ms, over the last 4096), group sizes, segments."""
        w = self._writer
        with self._gc.mutex:
            st = w.stats.report()
            st.update(first_lsn=w.files.first_lsn, last_lsn=self._gc.next_lsn - 1, durable_lsn=w.durable[0],
                      segments=w.files.count, sync=self.sync_mode, dropped_bytes_at_open=w.files.dropped_bytes)
        return st

    def __repr__(self) -> str:
        state = "closed" if self._appends.closed else f"LSN {self.first_lsn}..{self.last_lsn}, durable {self.durable_lsn}"
        return f"<wal.Log {self.directory!r} sync={self.sync_mode} {state}>"


def open(directory: str | os.PathLike[str], **options: object) -> Log:
    """Open (or create) the log in ``directory`` for writing. See :class:`Log`."""
    return Log(directory, **options)  # type: ignore[arg-type]  # Log.__init__ checks each option's type at run time
