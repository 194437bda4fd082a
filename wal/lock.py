"""The one-writer lock: an exclusive, non-blocking ``flock`` on a ``LOCK`` file.

The file holds the pid of the holder, for the error a second writer gets. A
lock held by another process, or by another open of the same directory in
this process (flock locks belong to the open file), is :class:`LockedError`.
The kernel releases it when the holder's process dies, so a crash never
leaves a stale lock behind. A child forked from the holder closes its
inherited copy of the descriptor right after the fork (:mod:`wal.forkguard`):
it never holds, and cannot release, its parent's lock.

The lock also tells its holder whether its directory is still the one it
opened: the device and inode of the lock file and of the directory are
recorded when the lock is taken, and :meth:`DirectoryLock.check` compares
them with what the path names now. After ``rm -rf`` of the directory, or a
new directory made at the same path, the holder would otherwise go on
writing into deleted files (and a second writer could lock the new ones).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from typing import Self

from wal.errors import LockedError, StoreVanishedError
from wal.forkguard import track

LOCK_NAME = "LOCK"


class DirectoryLock:
    """``DirectoryLock(directory, what)`` takes the lock or raises
    :class:`LockedError` saying ``what`` is open elsewhere."""

    def __init__(self, directory: str, what: str | None = None) -> None:
        self.directory = directory
        self.path = path = os.path.join(directory, LOCK_NAME)
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
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._ids = (_identity(os.fstat(fd)), _identity(os.stat(directory)))
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        track(self)

    def _after_fork_in_child(self) -> None:
        # The child's copy of the descriptor shares the parent's flock: close
        # it (never unlock through it) and forget it, so release() is a no-op.
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def check(self) -> None:
        """Raise :class:`StoreVanishedError` when the lock file or the
        directory at this path is no longer the one locked (deleted, or
        replaced by another). Two ``stat`` calls; for rolls, syncs,
        snapshots and each fsync group of ``sync="always"`` (before it is
        acknowledged), not for every write."""
        for path, was, what in ((self.directory, self._ids[1], "directory"), (self.path, self._ids[0], "lock file")):
            try:
                now = _identity(os.stat(path))
            except (FileNotFoundError, NotADirectoryError):
                raise StoreVanishedError(f"its {what} {path} was deleted while it was open") from None
            if now != was:
                raise StoreVanishedError(
                    f"its {what} {path} was replaced while it was open (device/inode {was[0]}/{was[1]} "
                    f"when locked, {now[0]}/{now[1]} now)"
                )

    def release(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def held(path: str) -> Iterator[None]:
    """A short critical section shared with other processes: an exclusive
    ``flock`` on the file ``path`` (created), waited for, released on exit.
    For read-modify-write of a small file that several processes replace
    (the writers of :class:`DirectoryLock` never wait; these do)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino
