"""The writer's lease on an archive prefix (``ROOT/LEASE``; rules in
:mod:`kvstore.archive.layout`): one archiver writes a prefix at a time."""

from __future__ import annotations

import os
import socket
import time
import uuid

from kvstore.archive.layout import LEASE_NAME, ArchiverLease
from kvstore.archive.target import ArchiveTarget
from wal.errors import LockedError

DEFAULT_LEASE_SECONDS = 30.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ArchiverLeaseHolder:
    """Takes, renews and releases the lease for one archiver."""

    def __init__(self, target: ArchiveTarget, seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        self.target = target
        self.seconds = seconds
        self.mine = ArchiverLease(uuid.uuid4().hex, socket.gethostname(), os.getpid(), 0.0)
        self._renewed = 0.0
        self.held = False

    def _live_other(self) -> ArchiverLease | None:
        data = self.target.read(LEASE_NAME)
        lease = ArchiverLease.decode(data) if data is not None else None
        if lease is None or lease.owner == self.mine.owner:
            return None
        if lease.expires <= time.time():
            return None
        if lease.host == self.mine.host and lease.pid != self.mine.pid and not _pid_alive(lease.pid):
            return None  # its process on this host is gone (killed): take it over
        return lease

    def _refuse(self, other: ArchiverLease) -> LockedError:
        left = max(0.0, other.expires - time.time())
        return LockedError(
            f"the archive {self.target.uri} is being written by another archiver (host {other.host}, pid "
            f"{other.pid}; its lease runs {left:.0f} s more); stop it first, or wait for the lease to expire")

    def acquire(self) -> None:
        """Take the lease, or raise :class:`LockedError` while another archiver's is live."""
        other = self._live_other()
        if other is not None:
            raise self._refuse(other)
        self._write()
        other = self._live_other()  # read back: another archiver may have written at the same time
        if other is not None:
            self.held = False
            raise self._refuse(other)

    def renew(self) -> None:
        """Extend the lease when a third of it is used; :class:`LockedError`
        when another archiver took it (this one must stop writing)."""
        if not self.held:
            self.acquire()
            return
        if time.monotonic() - self._renewed < self.seconds / 3:
            return
        other = self._live_other()
        if other is not None:
            self.held = False
            raise self._refuse(other)
        self._write()

    def _write(self) -> None:
        lease = self.mine._replace(expires=time.time() + self.seconds)
        self.target.put(lease.encode(), LEASE_NAME)
        self._renewed = time.monotonic()
        self.held = True

    def release(self) -> None:
        """End the lease if it is still this archiver's (rewritten as expired:
        a PUT, not a delete, see :meth:`ArchiveTarget.delete`)."""
        if not self.held:
            return
        self.held = False
        data = self.target.read(LEASE_NAME)
        lease = ArchiverLease.decode(data) if data is not None else None
        if lease is not None and lease.owner == self.mine.owner:
            self.target.put(self.mine._replace(expires=0.0).encode(), LEASE_NAME)
