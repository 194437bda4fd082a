"""Opening the LMDB environment of a store's state machine (kvstore/state/machine.py).

The options, and why:

* ``sync=False, metasync=False``: LMDB's fsyncs are not on the commit path,
  the log's are (whether to trust the environment after a crash is decided
  from the SESSION record, kvstore/store/recovery.py).
* ``writemap`` (default): commits write through the shared map (3x faster
  than ``pwrite``); the map's file is then given real blocks up front
  (:func:`~kvstore.state.lmdb_ops.preallocate`) so that a full disk is an error
  and not a SIGBUS.
* the map size is a whole number of MiB and at least 1 MiB. A reader's is at
  least the file's current size (the writer may have grown it). A writer's
  is the ``map_size`` asked for (small by default), or the blocks
  ``data.mdb`` already has if more, never its apparent size (a map grown
  into space the disk then lacked leaves a longer, sparse file); LMDB raises
  it to what the data uses, and with ``writemap`` sets the file to it. So a
  fresh store opens on a small file system, and a store reopened after its
  disk filled asks only for what it has. :meth:`kvstore.state.environment.Environment.grow`
  grows it later in bounded steps that fit the free space
  (:func:`grow_size`).
* ``max_dbs`` (:data:`MAX_DBS`): the main database (walkv's bookkeeping),
  ``data`` (the default keyspace), one named database ``ks:<name>`` per
  keyspace (:data:`MAX_KEYSPACES`) and the expiry metadata's five
  (``ttl:...``, ``lease:...``, :mod:`kvstore.state.expiry`) and the staged
  groups' ``groups`` (:mod:`kvstore.state.groups`; room is kept for 8). LMDB sizes every read transaction by it (about 50 bytes a
  slot), so it is a bound, not a guess.

Stale readers: LMDB never reuses the pages an open read transaction may
see, and a reader whose process died (SIGKILL in the middle of a scan)
keeps its slot in the reader table until someone calls ``reader_check``.
walkv clears such slots when it opens an environment, before every growth
of the map and, in the writer, at most once a second
(:func:`clear_stale_readers`); without it one killed reader made the
writer's map grow without bound.
"""

from __future__ import annotations

import errno
import os

import lmdb

from kvstore.state.lmdb_ops import preallocate
from wal.errors import CorruptionError, DiskFullError, WalkvError
from wal.failures import file_error
from wal.forkguard import forked_error, inherited_from

MIB = 1 << 20
MAX_KEYSPACES = 200
"""Keyspaces an environment holds at most: named databases are never
deleted from a live environment (a dropped keyspace is emptied; a rebuild
leaves it out), so this counts every keyspace written since LMDB was built."""
MAX_DBS = 256
"""The main database, ``data``, the keyspaces, walkv's own (<= 8), and room
for 46 new keyspaces whose writers raced past the limit's check at once."""

# What only a damaged environment raises: walkv then rebuilds it from the log.
# Anything else (permissions, memory, reader slots) is the machine's, and a
# rebuild would not help, so it is reported instead.
DAMAGED = (lmdb.CorruptedError, lmdb.InvalidError, lmdb.VersionMismatchError,
           lmdb.PageNotFoundError, lmdb.PanicError)


def open_env(path: str, *, readonly: bool, map_size: int, writemap: bool,
             max_readers: int) -> tuple[lmdb.Environment, lmdb._Database, lmdb._Database]:
    """``(env, main_db, data_db)`` of the environment at ``path``, created
    unless ``readonly``. ``writemap`` must already be False when ``readonly``."""
    data_file = os.path.join(path, "data.mdb")
    try:
        existing = os.path.getsize(data_file)
    except OSError:
        existing = 0
    parent = inherited_from(path)
    if parent is not None:
        raise forked_error(f"the store's LMDB environment {path}", parent)
    if readonly and not existing:
        raise WalkvError(f"{path} holds no state yet: open the store "
                         f"read-write once to create it")
    if not readonly:
        existing = _allocated(data_file)
        os.makedirs(path, mode=0o700, exist_ok=True)
    size = max(int(map_size), existing, MIB)
    size = (size + MIB - 1) & ~(MIB - 1)  # a whole number of MiB
    try:
        env = lmdb.open(
            path, map_size=size, subdir=True, readonly=readonly,
            metasync=False, sync=False, writemap=writemap,
            map_async=False, max_dbs=MAX_DBS, max_readers=max_readers,
            max_spare_txns=16, lock=True, mode=0o600, create=not readonly,
            readahead=False,
        )
    except lmdb.Error as exc:
        if "already open in this process" in str(exc):
            raise WalkvError(
                f"the store's LMDB environment {path} is already open in this "
                f"process (LMDB allows one open per process); share that "
                f"KVStore between threads instead") from None
        raise open_error(exc, path, size) from None
    try:
        clear_stale_readers(env)  # before the map is sized: dead readers pin pages
        if writemap:
            preallocate(data_file, env.info()["map_size"])  # LMDB's: at least what the data uses
        main = env.open_db(None)
        data = env.open_db(b"data", create=not readonly)
    except BaseException as exc:
        env.close()
        if isinstance(exc, lmdb.Error):
            raise CorruptionError(f"LMDB environment is unreadable: {exc}",
                                  path=path) from None
        raise
    return env, main, data


def _allocated(data_file: str) -> int:
    try:
        return os.stat(data_file).st_blocks * 512
    except FileNotFoundError:
        return 0


def fit_map(path: str, want: int) -> int:
    """The largest map size up to ``want`` (whole MiB) that the environment
    at ``path`` can have blocks for: what ``data.mdb`` already holds plus
    the free space of its file system."""
    st = os.statvfs(path)
    room = _allocated(os.path.join(path, "data.mdb")) + st.f_bavail * st.f_frsize
    return min(want, room) & ~(MIB - 1)


def grow_size(path: str, old: int, step: int, at_least: int = 0) -> int:
    """The map size to grow to from ``old``: ``old + step``, but never by
    more than half the free space (at least 1 MiB, and at least
    ``at_least``), so that near a full disk the map grows in small steps and
    takes only what the data needs; :class:`DiskFullError` when not even
    that fits."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    want = max(old + min(step, max(MIB, free // 2)), at_least)
    new = fit_map(path, want)
    if new < max(old + MIB, at_least):
        raise DiskFullError(
            f"no space to grow the LMDB map of {path} beyond {old / MIB:.0f} MiB "
            f"({free / MIB:.1f} MiB free on its file system)")
    return new


def open_error(exc: lmdb.Error, path: str, size: int) -> WalkvError:
    """walkv's error for ``lmdb.open`` failing: :class:`CorruptionError`
    (which makes the store rebuild the environment) only when the files are
    damaged; otherwise what went wrong and what to do."""
    if isinstance(exc, DAMAGED):
        return CorruptionError(f"cannot open the LMDB environment: {exc}", path=path)
    doing = f"opening the LMDB environment {path}"
    if isinstance(exc, lmdb.ReadonlyError):
        return file_error(OSError(errno.EACCES, os.strerror(errno.EACCES), path), doing)
    if isinstance(exc, lmdb.DiskError):
        return file_error(OSError(errno.EIO, f"{os.strerror(errno.EIO)}: {exc}", path), doing)
    if "No space left" in str(exc):
        return file_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path), doing)
    if isinstance(exc, lmdb.MemoryError) or os.strerror(errno.EFBIG) in str(exc):
        return WalkvError(f"{doing}: cannot map {size >> 20} MiB ({exc}); lower the map_size "
                          f"option, or raise the process's address-space limit (ulimit -v)")
    if isinstance(exc, lmdb.ReadersFullError):
        return WalkvError(f"{doing}: every LMDB reader slot is taken ({exc}); close other "
                          f"readers of the store, or reopen it with a larger max_readers")
    return WalkvError(f"{doing} failed: {exc}. Nothing was changed; if it persists, "
                      f"moving {path} aside makes the next read-write open rebuild it from the log")



def reader_table(env: lmdb.Environment) -> tuple[int, int, int | None]:
    """``(slots, reading, oldest)`` of LMDB's reader lock table, shared by
    every process that has the environment open: the reader slots in use
    (a slot is kept by a process, per thread or transaction, for as long as
    it has the environment open), how many of them are inside a read
    transaction now, and the oldest transaction id such a reader sees (None:
    none is reading). A slot whose process died stays until
    ``env.reader_check()`` clears it."""
    slots = reading = 0
    oldest: int | None = None
    for line in env.readers().splitlines()[1:]:  # "pid thread txnid"; txnid "-" when idle
        parts = line.split()
        if len(parts) != 3:
            continue
        slots += 1
        if parts[2] != "-":
            reading += 1
            txnid = int(parts[2])
            oldest = txnid if oldest is None else min(oldest, txnid)
    return slots, reading, oldest


def clear_stale_readers(env: lmdb.Environment) -> int:
    """Clear the reader slots of processes that died (a reader killed in the
    middle of a scan keeps its snapshot's pages from being reused until its
    slot is cleared); return how many were."""
    try:
        return env.reader_check()
    except lmdb.Error:
        return 0
