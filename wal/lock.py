"""The one-writer lock: an exclusive, non-blocking ``flock`` on a ``LOCK`` file.

The file holds the pid of the holder, for the error a second writer gets. A
lock held by another process, or by another open of the same directory in
this process (flock locks belong to the open file), is :class:`LockedError`.
The kernel releases it when the holder's process dies, so a crash never
leaves a stale lock behind. A child forked from the holder closes its
inherited copy of the descriptor right after the fork (:mod:`wal.forkguard`):
it never holds, and cannot release, its parent's lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Self

from wal.errors import LockedError
from wal.forkguard import track

LOCK_NAME = "LOCK"


class DirectoryLock:
    """``DirectoryLock(directory, what)`` takes the lock or raises
    :class:`LockedError` saying ``what`` is open elsewhere."""

    def __init__(self, directory: str, what: str | None = None) -> None:
        path = os.path.join(directory, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LockedError(
                    f"{what or directory} is open for writing by another process (pid {holder}) "
                    "or by another open in this one; close it there first"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        track(self)

    def _after_fork_in_child(self) -> None:
        # The child's copy of the descriptor shares the parent's flock: close
        # it (never unlock through it) and forget it, so release() is a no-op.
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def release(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
