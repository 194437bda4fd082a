"""The operations that take a log to themselves to make it durable or let it
go: :meth:`LogSync.sync`, :meth:`LogSync.check_directory` and
:meth:`LogSync.close` (a base class of :class:`wal.Log`; durability as
:mod:`wal.log` states it). Each waits its turn behind the group being
written (:meth:`wal.commit.GroupCommit.exclusive`), and each checks first
that the log's directory is still the one opened: nothing is made "durable"
in files that are no longer at the log's path.
"""

from __future__ import annotations

from wal.commit import GroupCommit
from wal.durable import DurableMarker
from wal.errors import ClosedError, LogFailedError, StoreVanishedError
from wal.flusher import BatchFlusher
from wal.fs import FileSystem
from wal.lock import DirectoryLock
from wal.segment_writer import ActiveSegment


class LogSync:
    """sync, check_directory and close of :class:`wal.Log`."""

    directory: str
    _fs: FileSystem
    _gc: GroupCommit
    _lock: DirectoryLock
    _active: ActiveSegment
    _durable_marker: DurableMarker
    _flusher: BatchFlusher | None
    _durable: tuple[int, int]
    _written: tuple[int, int]
    _failure: LogFailedError | None
    _closed: bool

    def _timed_sync(self, full: bool = False) -> None:
        raise NotImplementedError  # Log's

    def _publish_durable(self) -> None:
        raise NotImplementedError  # Log's

    def check_directory(self) -> None:
        """Raise :class:`StoreVanishedError` (and fail the log) when its
        directory or lock file was deleted or replaced since it was opened;
        raise the log's failure if it already failed that way. For callers
        about to write beside the log (snapshots)."""
        if isinstance(self._failure, StoreVanishedError):
            raise self._failure
        try:
            self._lock.check()
        except StoreVanishedError as e:
            raise self._gc.fail(e, self._written[0] + 1) from e

    def sync(self) -> int:
        """Make everything appended so far durable; return the durable LSN.
        Checks first that the directory is still the one opened."""
        with self._gc.exclusive():
            try:
                self._lock.check()
            except StoreVanishedError as e:
                raise self._gc.fail(e, self._durable[0] + 1) from e
            target = self._written
            if self._durable[0] < target[0]:
                try:
                    self._timed_sync()
                except OSError as e:
                    raise self._gc.fail(e, self._durable[0] + 1) from e
                self._durable = target
                self._publish_durable()
        return self._durable[0]

    def close(self) -> None:
        """Write what is queued, sync everything, write the active segment's
        index (so the next open scans little) and release the lock.
        Idempotent. After a failure it only releases, except that a log
        whose directory vanished (found now or before) raises
        :class:`StoreVanishedError`: nothing of it could be made durable."""
        if self._closed:
            return
        error: OSError | None = None
        vanished: BaseException | None = self._failure if isinstance(self._failure, StoreVanishedError) else None
        try:
            if self._failure is None:
                with self._gc.exclusive():
                    self._closed = True  # refuses appends from here on
                    try:
                        self._lock.check()
                    except StoreVanishedError as e:
                        vanished = self._gc.fail(e, self._written[0] + 1)
                        raise vanished from e
                    if self._durable[0] < self._written[0]:
                        self._timed_sync()
                        self._durable = self._written
                        self._publish_durable()
                    self._active.write_index(self._fs)
                    self._fs.fsync_dir(self.directory)
        except OSError as e:
            error = e
        except StoreVanishedError:
            pass  # raised below, once everything is released
        finally:
            with self._gc.mutex:
                self._closed = True
            if self._flusher is not None:
                self._flusher.stop()
            self._gc.stop(self._failure or ClosedError("the log was closed before this entry was written"))
            self._active.close()
            self._durable_marker.close()
            self._lock.release()
        if vanished is not None:
            raise vanished
        if error is not None:
            raise LogFailedError(
                f"closing the log at {self.directory} failed: {error.strerror} ({error.filename or self._active.file.path}). "
                f"Entries up to LSN {self._durable[0]} are durable; those written after it may not be. "
                "The next open recovers the log."
            ) from error
