"""What a read replica (:mod:`kvstore.replica.replica`) follows: a store's files, or
an archive of one.

Both give the same few things: the source's store id, its durable LSN, its
entries from an LSN (strictly checked; :class:`~wal.errors.LogGapError` when
retention deleted them), the newest verified snapshot a replica can start
from, and a fence for :meth:`kvstore.replica.replica.Replica.promote`.

* :class:`StoreSource`, a store directory (the writer may be another
  process, running or dead): bounded by its ``DURABLE`` marker, read with a
  :class:`kvstore.watch.log_tail.LogTail` that keeps its segment open (a read of
  the new bytes per poll); snapshots from ``STORE/snapshots``
  (:func:`kvstore.store.snapshots.choose_base`). Its fence is the store's lock:
  taking it fails with :class:`~wal.errors.LockedError` while a writer lives.
* :class:`ArchiveSource`, an archive (:mod:`kvstore.archive`; a URI, a
  ``(filesystem, path)`` pair or a local archive directory): bounded by the
  end of the archive's contiguous chain (a listing per poll, so its default
  poll interval is a second), read with :meth:`ArchiveReader.read_entries`
  (whole objects); snapshots from the archive. Its fence is the archive's
  lease: a live archiver still ships the source.
* :class:`kvstore.replica.http_source.HttpSource`, a store served over HTTP
  (``http://`` or ``https://``; :mod:`kvstore.server`): bounded by the
  server's durable LSN, read through its log and snapshot endpoints. Its
  fence is that nothing answers at the URL any more; after it the source is
  gone, and reading it raises :class:`~wal.errors.SourceGoneError` (promote
  keeps what the replica applied).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any, Protocol

import snapshot
from kvstore.archive.layout import ARCHIVE_NAME, LEASE_NAME, ArchiverLease
from kvstore.archive.reader import ArchiveReader
from kvstore.layout import StoreLayout
from kvstore.replica.archive_restore import ArchiveLog, choose_snapshot
from kvstore.replica.restore import LogFiles
from kvstore.store import recovery
from kvstore.store.snapshots import choose_base
from kvstore.watch.consumers import LiveHold
from kvstore.watch.log_tail import LogTail
from wal.durable import read_durable_lsn
from wal.errors import LockedError, ReplicaError, WalkvError
from wal.lock import DirectoryLock
from wal.segment import Entry, list_segments, read_header, read_store_id
from wal.timeline import ROOT, History

STORE_POLL_SECONDS = 0.002
ARCHIVE_POLL_SECONDS = 1.0

log = logging.getLogger("walkv.replica")


class Fence(Protocol):
    def release(self) -> None: ...


class ReplicaSource(Protocol):
    """What a replica needs of its source (module docstring)."""

    name: str
    store_id: str
    poll_seconds: float
    wal_dir: str | None  # a log directory a watcher can read (None: an archive)
    snapshots_dir: str | None

    def durable_lsn(self) -> int: ...
    def history(self) -> History:
        """The source log's timeline history now (:mod:`wal.timeline`): the
        entries read after this call, up to the next call, are on it when
        the next call returns the same (a fork changes it)."""
    def first_lsn(self) -> int: ...
    def entries(self, from_lsn: int, last: int) -> Iterator[Entry]: ...
    def reset(self) -> None: ...
    def base(self, last: int) -> snapshot.Snapshot | None: ...
    def log_source(self, last: int) -> recovery.LogSource: ...
    def fence(self) -> Fence | None: ...
    def hold(self, next_lsn: int) -> LiveHold | None:
        """Ask the source's log retention to keep the log from ``next_lsn``
        while the replica runs (None: the source has no such retention)."""
    def close(self) -> None: ...


class StoreSource:
    """A store directory's files (module docstring)."""

    poll_seconds = STORE_POLL_SECONDS

    def __init__(self, path: str) -> None:
        self.layout = StoreLayout.of(os.path.abspath(path))
        self.name = self.layout.display()
        self.wal_dir: str | None = self.layout.wal_dir
        self.snapshots_dir: str | None = self.layout.snapshots_dir
        self._wal = self.layout.wal_dir
        sid = read_store_id(self._wal, self.layout.fs)
        if sid is None:
            raise WalkvError(f"{self.name} is not a walkv store with a log (no segment in {self._wal}); "
                             "a replica follows a store directory or an archive")
        self.store_id = sid
        self._tail: LogTail | None = None
        self._history: tuple[tuple[str, int], History] | None = None  # keyed by the newest segment's file

    def durable_lsn(self) -> int:
        return read_durable_lsn(self._wal, self.layout.fs) or 0

    def history(self) -> History:
        """The newest segment's header's (read again only when that file changes)."""
        fs = self.layout.fs
        for _ in range(3):  # the newest segment may be rolled or replaced while we look
            segments = list_segments(self._wal, fs)
            if not segments:
                return ROOT
            path = segments[-1].path
            try:
                key = (path, os.stat(path).st_ino)
                if self._history is not None and self._history[0] == key:
                    return self._history[1]
                with fs.open_input(path) as f:
                    history = read_header(f, fs.display(path))[0].history
            except FileNotFoundError:
                continue
            self._history = (key, history)
            return history
        raise ReplicaError(f"{self.name}: its newest log segment keeps vanishing while being read")

    def first_lsn(self) -> int:
        segments = list_segments(self._wal, self.layout.fs)
        return segments[0].first_lsn if segments else 1

    def entries(self, from_lsn: int, last: int) -> Iterator[Entry]:
        tail = self._tail
        if tail is None or tail.next_lsn != from_lsn:
            self.reset()
            sid = read_store_id(self._wal, self.layout.fs)
            if sid is not None and sid != self.store_id:
                raise ReplicaError(f"{self.name} now holds another store ({sid}); this replica follows "
                                   f"store {self.store_id}")
            tail = self._tail = LogTail(self._wal, from_lsn, fs=self.layout.fs)
        return tail.read(last)

    def reset(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None

    def base(self, last: int) -> snapshot.Snapshot | None:
        parent = self.layout.snapshots_dir
        found = [i.path for i in reversed(snapshot.list_snapshots(parent))]
        return choose_base(found, self._wal, self.first_lsn(), last, self.store_id)

    def log_source(self, last: int) -> recovery.LogSource:
        return LogFiles(self._wal, self.first_lsn(), last)

    def fence(self) -> Fence:
        return DirectoryLock(self.layout.root, f"the source store {self.name}")

    def hold(self, next_lsn: int) -> LiveHold | None:
        try:
            return LiveHold(self.layout.root, next_lsn)
        except OSError as exc:  # a store this process may read but not write
            log.warning("%s: cannot ask its retention to keep the log for this replica (%s); a replica that "
                        "falls behind it rebuilds from a snapshot", self.name, exc)
            return None

    def close(self) -> None:
        self.reset()


class ArchiveSource:
    """An archive of a store (module docstring)."""

    poll_seconds = ARCHIVE_POLL_SECONDS
    wal_dir: str | None = None
    snapshots_dir: str | None = None

    def __init__(self, location: Any) -> None:
        self.reader = ArchiveReader(location)
        self.name = self.reader.uri
        self.store_id = self.reader.store_id

    def durable_lsn(self) -> int:
        return self.reader.last_lsn

    def history(self) -> History:
        return self.reader.history

    def first_lsn(self) -> int:
        return self.reader.first_lsn or 1

    def entries(self, from_lsn: int, last: int) -> Iterator[Entry]:
        return self.reader.read_entries(from_lsn, last)

    def reset(self) -> None:
        pass

    def base(self, last: int) -> snapshot.Snapshot | None:
        return choose_snapshot(self.reader, last, self.reader.first_lsn)

    def log_source(self, last: int) -> recovery.LogSource:
        return ArchiveLog(self.reader, self.first_lsn(), last)

    def fence(self) -> None:
        data = self.reader.target.read(LEASE_NAME)
        lease = ArchiverLease.decode(data) if data is not None else None
        if lease is not None and lease.expires > time.time():
            raise LockedError(f"the archive {self.name} is still being written by an archiver (host "
                              f"{lease.host}, pid {lease.pid}, lease for {lease.expires - time.time():.0f} s "
                              "more): its source is alive; stop it first")
        return None

    def hold(self, next_lsn: int) -> None:
        return None  # an archive's retention is its own (kvstore.archive.retention)

    def close(self) -> None:
        pass


def open_source(location: Any, *, token: str | None = None, verify: bool | str = True,
                download_dir: str | None = None) -> ReplicaSource:
    """The source at ``location``: an ``http://`` or ``https://`` URL is a
    served store (:class:`~kvstore.replica.http_source.HttpSource`, with the
    bearer ``token``, ``verify``: TLS verification as httpx takes it, True, False
    or a CA bundle's path, and ``download_dir`` for snapshots); a local
    directory holding a store's log is a :class:`StoreSource`; anything else
    (a URI, a ``(filesystem, path)`` pair, a directory holding an ``ARCHIVE``
    object) an :class:`ArchiveSource`."""
    if isinstance(location, str) and location.lower().startswith(("http://", "https://")):
        from kvstore.replica.http_source import HttpSource

        return HttpSource(location, token=token, verify=verify, download_dir=download_dir)
    if token is not None or verify is not True:
        raise ValueError(f"token= and verify= are for a served store (an http:// or https:// URL), not {location!r}")
    if isinstance(location, (str, os.PathLike)):
        path = os.fspath(location)
        if "://" not in path and not os.path.exists(os.path.join(path, ARCHIVE_NAME)):
            return StoreSource(path)
    return ArchiveSource(location)
