"""The file operations walkv's durability depends on, behind one small seam.

:class:`FileSystem` is also the local implementation of the read-only seam
(:class:`wal.readfs.ReadFS`) every reader goes through.

The log and the snapshots do every write, sync, rename and unlink through a
:class:`FileSystem`, so that tests can swap in a fault-injecting one (power
loss, torn writes, failed fsyncs, ENOSPC) the way LevelDB's
FaultInjectionTestEnv and SQLite's test VFS do. Production code always uses
:data:`OS_FS`; nothing outside tests selects another.

Durability rules this module makes easy to follow:

* data is durable once ``File.sync()`` returns (``fdatasync`` where the file
  size did not change, ``fsync`` otherwise is the caller's choice: ``sync(full=True)``);
* a created, renamed or deleted name is durable once ``fsync_dir`` of its
  directory returns.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import BinaryIO, Final, NamedTuple

from mypy_extensions import mypyc_attr

_HAS_FDATASYNC: Final = hasattr(os, "fdatasync")
_HAS_FALLOCATE: Final = hasattr(os, "posix_fallocate")
_HAS_FADVISE: Final = hasattr(os, "posix_fadvise")
_pwrite: Final = os.pwrite
# Files walkv creates are private to their owner unless configured otherwise.
DEFAULT_FILE_MODE: Final = 0o600
DEFAULT_DIR_MODE: Final = 0o700
_IOV_MAX: Final = max(16, min(1024, os.sysconf("SC_IOV_MAX"))) if hasattr(os, "sysconf") else 16


class FileInfo(NamedTuple):
    """One directory entry, as :meth:`FileSystem.list_dir` (and every
    :class:`wal.readfs.ReadFS`) lists it."""

    name: str
    path: str
    size: int
    is_dir: bool


@mypyc_attr(allow_interpreted_subclasses=True)  # the tests' fault injectors subclass it
class File:
    """An open file addressed by offset (``pwrite``), as the log uses it."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of ``data`` at ``offset`` (short writes are retried)."""
        n = _pwrite(self.fd, data, offset)
        if n == len(data):
            return
        view = memoryview(data)[n:]
        offset += n
        while view:
            n = os.pwrite(self.fd, view, offset)
            if n == 0:  # pragma: no cover - the kernel never does this for files
                raise OSError(errno.EIO, "pwrite wrote nothing", self.path)
            view = view[n:]
            offset += n

    def pwritev(self, buffers: Sequence[bytes | memoryview], offset: int) -> None:
        """Write the concatenation of ``buffers`` at ``offset`` without
        joining them (``os.pwritev``, at most ``IOV_MAX`` buffers a call;
        short writes are retried)."""
        i = 0
        count = len(buffers)
        while i < count:
            batch = buffers[i : i + _IOV_MAX]
            n = os.pwritev(self.fd, batch, offset)
            offset += n
            for j, buf in enumerate(batch):
                size = len(buf)
                if n < size:  # a short write: the rest of this buffer, then on
                    self.pwrite(bytes(memoryview(buf)[n:]), offset)
                    offset += size - n
                    i += j + 1
                    break
                n -= size
            else:
                i += len(batch)

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def sync(self, *, full: bool = False) -> None:
        """Make written data durable: fdatasync, or fsync when ``full`` (the
        file's size or other metadata changed and must survive too)."""
        if full or not _HAS_FDATASYNC:
            os.fsync(self.fd)
        else:
            os.fdatasync(self.fd)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def preallocate(self, offset: int, length: int) -> None:
        """Reserve ``[offset, offset+length)`` past the end of the file, reading
        as zeros, so later writes there change no file size: ``posix_fallocate``
        (unwritten extents), or :meth:`write_zeros` where there is none. A full
        disk is ENOSPC here, as with zeros written. (The log picks this or
        :meth:`write_zeros` by its sync mode: :func:`wal.segment_writer.reserve`.)"""
        if _HAS_FALLOCATE:
            os.posix_fallocate(self.fd, offset, length)
        else:
            self.write_zeros(offset, length)

    def write_zeros(self, offset: int, length: int) -> None:
        """Write zeros over ``[offset, offset+length)``, erasing what was there
        (a cut tail: the format reads zeros as the end of the data)."""
        chunk = bytes(min(length, 1 << 20))
        end = offset + length
        while offset < end:
            piece = chunk if end - offset >= len(chunk) else chunk[: end - offset]
            self.pwrite(piece, offset)
            offset += len(piece)

    def drop_cached(self) -> None:
        """Ask the kernel to drop the file's clean pages from its page cache
        (``POSIX_FADV_DONTNEED``; a no-op where there is none): a hint that
        changes no byte and no durability, for data that was written once,
        is synced, and is seldom read again."""
        if _HAS_FADVISE:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


@mypyc_attr(allow_interpreted_subclasses=True)  # the tests' fault injectors subclass it
class FileSystem:
    """The real file system. Subclassed by the tests' fault injector."""

    file_mode = DEFAULT_FILE_MODE
    dir_mode = DEFAULT_DIR_MODE

    def open(self, path: str, *, create: bool = False, exclusive: bool = False,
             readonly: bool = False) -> File:
        flags = os.O_RDONLY if readonly else os.O_RDWR
        if create:
            flags |= os.O_CREAT
        if exclusive:
            flags |= os.O_EXCL
        flags |= getattr(os, "O_CLOEXEC", 0)
        return File(path, os.open(path, flags, self.file_mode))

    def write_file(self, path: str, data: bytes | bytearray | memoryview) -> None:
        """Create (or replace) ``path`` with ``data`` and fsync it. Not atomic:
        callers write to a temporary name and :meth:`rename`."""
        f = self.open(path, create=True)
        try:
            f.truncate(0)
            f.pwrite(data, 0)
            f.sync(full=True)
        finally:
            f.close()

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def mkdir(self, path: str) -> None:
        """Create one directory (its parent exists). Not durable until its
        parent is fsynced: use :meth:`makedirs`."""
        os.mkdir(path, self.dir_mode)

    def makedirs(self, path: str) -> None:
        """Create ``path`` and any missing parents, each durably (the parent
        of every directory created is fsynced)."""
        path = os.path.abspath(path)
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        for d in reversed(missing):
            try:
                self.mkdir(d)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise
                continue
            self.fsync_dir(os.path.dirname(d))

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def fsync_dir(self, path: str) -> None:
        """Make created, renamed and deleted names in ``path`` durable."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- the read-only seam (wal.readfs.ReadFS) for local files ----------------

    def list_dir(self, path: str) -> list[FileInfo]:
        """The entries of ``path`` (``[]`` when it does not exist); an entry
        removed while listing is left out."""
        out = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    try:
                        is_dir = e.is_dir()
                        size = 0 if is_dir else e.stat().st_size
                    except FileNotFoundError:
                        continue
                    out.append(FileInfo(e.name, e.path, size, is_dir))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return out

    def open_input(self, path: str) -> BinaryIO:
        return open(path, "rb")

    def read_file(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def join(self, base: str, *names: str) -> str:
        return os.path.join(base, *names)

    def display(self, path: str) -> str:
        return path


OS_FS: Final = FileSystem()


def file_in_the_way(path: str) -> str | None:
    """The first existing component of ``path`` (itself, else its nearest
    existing ancestor) when it is not a directory, or None: a directory is
    at ``path`` or can be made there. For the one message a command gives
    when asked to make a directory where a file is."""
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent
    return None if os.path.isdir(p) else p
