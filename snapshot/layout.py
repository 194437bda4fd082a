"""The snapshots directory: names, the commit protocol, crash-safe removal.

Layout of a snapshots parent directory (``STORE/snapshots/``)::

    snap-<lsn:020d>/               a snapshot; it exists iff its MANIFEST is valid
        MANIFEST                   and names the same LSN (snapshot.manifest)
        chunk-000000.wkc ...       chunk files (snapshot.chunk)
    snap-<lsn:020d>.tmp-<hex>/     a snapshot being written (its writer holds a
                                   flock on the directory) or left by a crash
    snap-<lsn:020d>.del-<hex>/     a snapshot being deleted, or left by a crash

Rules, and the reason for each:

* Write: chunks and MANIFEST go into a ``.tmp-`` directory, each file fsynced,
  then the directory is fsynced, renamed to ``snap-<lsn>`` and the parent
  fsynced. The rename is the commit point: before it no reader can mistake a
  half-written snapshot for one (listing never even opens it, so a reader
  racing a writer logs no false "broken snapshot" warning); after it every
  byte it names is durable.
* Delete: rename ``snap-<lsn>`` to ``.del-`` and fsync the parent, then
  remove the files. One atomic rename makes the snapshot stop existing, so a
  crash half-way through a delete never leaves a valid-looking snapshot with
  missing chunks.
* Only names matching these patterns are ever touched; anything else in the
  parent belongs to someone else. ``.tmp-`` directories whose flock is held
  belong to a live writer and are left alone.
* Chunk names inside a MANIFEST are untrusted: they must be plain file names
  (:func:`check_chunk_name`), so a manifest can never make a reader open a
  file outside its snapshot directory.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import secrets
import stat

from wal.fs import FileSystem

log = logging.getLogger("walkv.snapshot")

MANIFEST_NAME = "MANIFEST"
CHUNK_SUFFIX = ".wkc"
LSN_DIGITS = 20
MAX_LSN = (1 << 64) - 1

_SNAP_RE = re.compile(r"snap-(\d{20})")
_TMP_RE = re.compile(r"snap-(\d{20})\.tmp-[0-9a-f]{1,64}")
_DEL_RE = re.compile(r"snap-(\d{20})\.del-[0-9a-f]{1,64}")
_CHUNK_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")


def snapshot_dir_name(lsn: int) -> str:
    return f"snap-{lsn:0{LSN_DIGITS}d}"


def chunk_file_name(index: int) -> str:
    return f"chunk-{index:06d}{CHUNK_SUFFIX}"


def tmp_dir_name(lsn: int) -> str:
    return f"{snapshot_dir_name(lsn)}.tmp-{secrets.token_hex(8)}"


def del_dir_name(lsn: int) -> str:
    return f"{snapshot_dir_name(lsn)}.del-{secrets.token_hex(8)}"


def parse_snapshot_dir_name(name: str) -> int | None:
    """The LSN of a committed snapshot directory name, else ``None``."""
    m = _SNAP_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def is_incomplete_name(name: str) -> bool:
    """A ``.tmp-`` or ``.del-`` directory name (a write or delete in progress or interrupted)."""
    return bool(_TMP_RE.fullmatch(name) or _DEL_RE.fullmatch(name))


def is_tmp_name(name: str) -> bool:
    return bool(_TMP_RE.fullmatch(name))


def check_chunk_name(name: object) -> str | None:
    """Why ``name`` is not an acceptable chunk file name, or ``None`` if it is.

    Accepted: 1 to 255 characters of ``[A-Za-z0-9._-]``, not starting with a
    dot, and not ``MANIFEST``. That excludes ``..``, absolute paths, path
    separators, NUL and every name the writer uses for something else.
    """
    if not isinstance(name, str):
        return f"chunk name is {type(name).__name__}, not a string"
    if "\x00" in name:
        return f"chunk name {name!r} contains NUL"
    if "/" in name or "\\" in name or os.path.isabs(name):
        return f"chunk name {name!r} is a path, not a plain file name"
    if name in (".", "..") or name.startswith("."):
        return f"chunk name {name!r} is not a plain file name"
    if name == MANIFEST_NAME:
        return "chunk name is the manifest's own name"
    if not _CHUNK_NAME_RE.fullmatch(name):
        return f"chunk name {name!r} has characters other than letters, digits, '.', '_', '-' or is too long"
    return None


class DirLock:
    """An exclusive, non-blocking flock on a directory, held while a writer fills it.

    Advisory and local: it only tells :func:`snapshot.cleanup_incomplete` in
    another process that the ``.tmp-`` directory is in use. Where the file
    system cannot lock directories the writer goes on unlocked.
    """

    def __init__(self, path: str) -> None:
        self.fd = -1
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def dir_in_use(path: str) -> bool:
    """True when another process (or this one) holds the writer's flock on ``path``,
    or when that cannot be determined (so it is left alone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False  # gone already, or not a directory: nothing to protect
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            log.debug("cannot flock %s (%s); leaving it alone", path, e)
        return True
    finally:
        os.close(fd)
    return False


def remove_tree(fs: FileSystem, path: str) -> None:
    """Delete ``path`` and everything under it through ``fs``, without following
    symlinks, then fsync its parent directory. Raises OSError on failure."""
    _remove_tree(fs, path)
    fs.fsync_dir(os.path.dirname(os.path.abspath(path)))


def _remove_tree(fs: FileSystem, path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        fs.unlink(path)
        return
    for name in fs.listdir(path):
        _remove_tree(fs, os.path.join(path, name))
    fs.rmdir(path)


def discard_dir(fs: FileSystem, parent: str, name: str, lsn: int) -> str:
    """Make ``parent/name`` stop existing as a snapshot at once (atomic rename to
    a ``.del-`` name, parent fsynced), then remove it. Returns the removed
    (renamed) path. A crash at any point leaves only a ``.del-`` leftover."""
    doomed = os.path.join(parent, del_dir_name(lsn))
    fs.rename(os.path.join(parent, name), doomed)
    fs.fsync_dir(parent)
    remove_tree(fs, doomed)
    return doomed
