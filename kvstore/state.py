"""The state machine: an LMDB environment that the log's entries are applied to.

Layout of ``STORE/lmdb/`` (an LMDB environment directory)::

    data.mdb, lock.mdb   LMDB's own files
    SESSION              the session record (kvstore/session.py)

Named databases inside the environment:

* ``data``: the user's keys and values, exactly as given (LMDB's byte order).
* ``meta``: walkv's bookkeeping, keys and values as follows:

  ============  ==========================================================
  ``format``    ``b"1"``; a newer number is refused
  ``store_id``  the log's store id (hex); a mismatch means this LMDB was
                built from another log, so it is rebuilt
  ``applied``   uint64 little-endian: every entry with an LSN up to this
                one is applied, and none after it. Written in the same
                write transaction as the entries it covers, so LMDB's own
                atomicity makes applying idempotent (replay skips LSNs at or
                below it).
  ``complete``  ``b"1"`` once a rebuild's base (snapshot) load finished;
                ``b"0"`` while it runs, so an interrupted rebuild restarts
  ============  ==========================================================

Durability: LMDB is opened with ``sync=False, metasync=False``: its fsyncs are
not on the commit path, the log's are. A process crash cannot corrupt such an
environment (the dirty pages live in the kernel's page cache), a machine crash
can (pages reach the disk in any order), so whether to trust it on open is
decided from the SESSION record (see kvstore/recovery.py), not from LMDB's
contents, which might be a stale page after a machine crash.

Concurrency: one thread at a time applies (the log's committing thread, or the
opener while replaying); any number of threads read. Growing the map
(``set_mapsize``) needs no LMDB transaction active in this process, and
py-lmdb invalidates every open one; :class:`ReadGate` gives the writer that
moment without a lock on the read path, and scans re-seek when their
transaction was invalidated.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
from itertools import islice
from typing import Iterator

import lmdb
import msgpack

from kvstore.batch import OP_DELETE, OP_PUT, decode
from wal.errors import ClosedError, CorruptionError, LogFailedError, WalkvError

log = logging.getLogger("walkv.state")

FORMAT = b"1"
K_FORMAT = b"format"
K_STORE_ID = b"store_id"
K_APPLIED = b"applied"
K_COMPLETE = b"complete"

DEFAULT_MAP_SIZE = 64 << 20
_GROW_DOUBLE_UNTIL = 1 << 30
_U64 = struct.Struct("<Q")
_pack_u64 = _U64.pack
_unpackb = msgpack.unpackb


class ReadGate:
    """Readers run concurrently; the writer can wait for a moment when no
    reader is inside LMDB (to remap, or to close).

    A reader appends to :attr:`active` (atomic under the GIL), then checks
    :attr:`blocking`; the writer sets :attr:`blocking`, then waits for
    :attr:`active` to empty. Either the writer sees the reader or the reader
    sees the flag (Dekker's handshake; the GIL orders the steps), so there is
    no lock on the read path. A reader that sees the flag steps back and
    waits on the writer's mutex.
    """

    __slots__ = ("active", "blocking", "_mutex")

    def __init__(self) -> None:
        self.active: list[None] = []
        self.blocking = False
        self._mutex = threading.Lock()

    def enter(self) -> None:
        active = self.active
        while True:
            active.append(None)
            if not self.blocking:
                return
            active.pop()
            with self._mutex:
                pass

    def exit(self) -> None:
        self.active.pop()

    def acquire_exclusive(self) -> None:
        self._mutex.acquire()
        self.blocking = True
        spins = 0
        while self.active:
            spins += 1
            time.sleep(0 if spins < 100 else 0.0005)

    def release_exclusive(self) -> None:
        self.blocking = False
        self._mutex.release()


class State:
    """The LMDB environment of one store, and the apply and read paths.

    Not the public API (that is :class:`kvstore.KVStore`): keys here are
    already validated.
    """

    def __init__(self, path: str, *, readonly: bool = False,
                 map_size: int = DEFAULT_MAP_SIZE, writemap: bool = True,
                 max_readers: int = 1024) -> None:
        self.path = path
        self.readonly = readonly
        self.writemap = writemap and not readonly
        self._gate = ReadGate()
        self._closed = False
        self.map_gen = 0          # bumped whenever open transactions die
        self.map_grows = 0
        # counters (updated only by the applying thread)
        self.applied_groups = 0
        self.applied_entries = 0
        self.puts = 0
        self.deletes = 0
        self.delete_ranges = 0
        self.apply_seconds = 0.0
        self.apply_max_seconds = 0.0
        data_file = os.path.join(path, "data.mdb")
        try:
            existing = os.path.getsize(data_file)
        except OSError:
            existing = 0
        if readonly and not existing:
            raise WalkvError(f"{path} holds no state yet: open the store "
                             f"read-write once to create it")
        size = max(int(map_size), existing, 1 << 20)
        size = (size + 0xFFFFF) & ~0xFFFFF  # a whole number of MiB
        if not readonly:
            os.makedirs(path, mode=0o700, exist_ok=True)
        try:
            self.env = lmdb.open(
                path, map_size=size, subdir=True, readonly=readonly,
                metasync=False, sync=False, writemap=self.writemap,
                map_async=False, max_dbs=4, max_readers=max_readers,
                max_spare_txns=16, lock=True, mode=0o600, create=not readonly,
                readahead=False,
            )
        except lmdb.Error as exc:
            raise CorruptionError(f"cannot open the LMDB environment: {exc}",
                                  path=path) from None
        try:
            if self.writemap:
                _preallocate(data_file, size)
            if readonly:
                self._data = self.env.open_db(b"data", create=False)
                self._meta = self.env.open_db(b"meta", create=False)
            else:
                self._data = self.env.open_db(b"data")
                self._meta = self.env.open_db(b"meta")
            self._load_meta()
        except BaseException as exc:
            self.env.close()
            if isinstance(exc, WalkvError):
                raise
            if isinstance(exc, lmdb.Error):
                raise CorruptionError(f"LMDB environment is unreadable: {exc}",
                                      path=path) from None
            raise

    # -- meta ---------------------------------------------------------------

    def _load_meta(self) -> None:
        with self.env.begin(db=self._meta) as txn:
            fmt = txn.get(K_FORMAT)
            sid = txn.get(K_STORE_ID)
            applied = txn.get(K_APPLIED)
            complete = txn.get(K_COMPLETE)
        if fmt is not None and fmt != FORMAT:
            raise WalkvError(f"{self.path}: LMDB state format {fmt!r} is newer "
                             f"than this walkv ({FORMAT!r}); upgrade walkv")
        self.store_id = sid.decode("ascii", "replace") if sid else None
        self.applied_lsn = _U64.unpack(applied)[0] if applied and len(applied) == 8 else 0
        self.complete = complete == b"1"
        self.initialized = fmt is not None

    def initialize(self, store_id: str, base_lsn: int = 0, *, complete: bool) -> None:
        """Write the meta of a fresh (or rebuilding) environment."""
        meta = self._meta

        def write(txn: lmdb.Transaction) -> None:
            txn.put(K_FORMAT, FORMAT, db=meta)
            txn.put(K_STORE_ID, store_id.encode("ascii"), db=meta)
            txn.put(K_APPLIED, _pack_u64(base_lsn), db=meta)
            txn.put(K_COMPLETE, b"1" if complete else b"0", db=meta)
        self._with_write(write)
        self.store_id = store_id
        self.applied_lsn = base_lsn
        self.complete = complete
        self.initialized = True

    def load_base(self, pairs: Iterator[tuple[bytes, bytes]], base_lsn: int,
                  chunk: int = 10000) -> int:
        """Bulk-load sorted (key, value) pairs, then mark the environment
        complete at ``base_lsn``. Returns the number of pairs loaded."""
        n = 0
        it = iter(pairs)
        while True:
            items = list(islice(it, chunk))
            if not items:
                break
            self._with_write(lambda txn: txn.cursor(db=self._data).putmulti(
                items, dupdata=False, overwrite=True, append=False))
            n += len(items)
        meta = self._meta

        def finish(txn: lmdb.Transaction) -> None:
            txn.put(K_APPLIED, _pack_u64(base_lsn), db=meta)
            txn.put(K_COMPLETE, b"1", db=meta)
        self._with_write(finish)
        self.applied_lsn = base_lsn
        self.complete = True
        return n

    # -- writing ------------------------------------------------------------

    def _with_write(self, fn) -> None:
        """Run ``fn(txn)`` in one write transaction, growing the map and
        retrying as often as it fills."""
        while True:
            txn = self.env.begin(write=True, db=self._data)
            try:
                fn(txn)
                txn.commit()
                return
            except lmdb.MapFullError:
                txn.abort()
                self.grow()
            except BaseException:
                txn.abort()
                raise

    def apply(self, entries: list[tuple[int, bytes]], *, strict: bool = False) -> None:
        """Apply a group of log entries in ONE LMDB write transaction that also
        records the highest applied LSN. Entries at or below ``applied_lsn``
        are skipped, so applying is idempotent.

        ``strict`` validates each payload (:func:`kvstore.batch.decode`) before
        the transaction starts, so a corrupt entry writes nothing. The live
        path passes entries this process encoded and validated itself.
        """
        if self._closed:
            raise ClosedError("the store's state machine is closed")
        applied = self.applied_lsn
        if strict:
            todo = [(lsn, decode(p, lsn)) for lsn, p in entries if lsn > applied]
        else:
            todo = [(lsn, _unpackb(p)) for lsn, p in entries if lsn > applied]
        if not todo:
            return
        t0 = time.perf_counter()
        last = todo[-1][0]
        meta = self._meta
        data = self._data
        while True:
            txn = self.env.begin(write=True, db=data)
            try:
                put = txn.put
                delete = txn.delete
                puts = deletes = ranges = 0
                for _lsn, ops in todo:
                    for op in ops:
                        code = op[0]
                        if code == OP_PUT:
                            put(op[1], op[2])
                            puts += 1
                        elif code == OP_DELETE:
                            delete(op[1])
                            deletes += 1
                        else:
                            _delete_range(txn, op[1], op[2])
                            ranges += 1
                put(K_APPLIED, _pack_u64(last), db=meta)
                txn.commit()
            except lmdb.MapFullError:
                txn.abort()
                self.grow()
                continue
            except lmdb.Error as exc:
                txn.abort()
                raise LogFailedError(
                    f"applying LSNs {todo[0][0]}..{last} to LMDB ({self.path}) "
                    f"failed: {exc}. Every acknowledged write is in the log; "
                    f"close and reopen the store to go on.") from None
            except BaseException:
                txn.abort()
                raise
            break
        self.applied_lsn = last
        dt = time.perf_counter() - t0
        self.applied_groups += 1
        self.applied_entries += len(todo)
        self.puts += puts
        self.deletes += deletes
        self.delete_ranges += ranges
        self.apply_seconds += dt
        if dt > self.apply_max_seconds:
            self.apply_max_seconds = dt

    def grow(self, at_least: int = 0) -> None:
        """Grow the map: double up to 1 GiB, then by half. Waits for readers
        to leave LMDB; their open transactions are invalidated (scans
        re-seek)."""
        old = self.env.info()["map_size"]
        new = old * 2 if old < _GROW_DOUBLE_UNTIL else old + old // 2
        new = max(new, at_least)
        new = (new + 0xFFFFF) & ~0xFFFFF
        if self.writemap:
            _preallocate(os.path.join(self.path, "data.mdb"), new)
        gate = self._gate
        gate.acquire_exclusive()
        try:
            self.env.set_mapsize(new)
            self.map_gen += 1
        finally:
            gate.release_exclusive()
        self.map_grows += 1
        log.info("LMDB map of %s grown from %d to %d MiB", self.path,
                 old >> 20, new >> 20)

    def _adopt_mapsize(self) -> None:
        """Read-only: another process grew the map; adopt its size."""
        gate = self._gate
        gate.acquire_exclusive()
        try:
            self.env.set_mapsize(0)
            self.map_gen += 1
        finally:
            gate.release_exclusive()

    # -- reading ------------------------------------------------------------

    def _enter(self) -> None:
        gate = self._gate
        gate.enter()
        if self._closed:
            gate.exit()
            raise ClosedError("the store is closed")

    def get(self, key: bytes) -> bytes | None:
        gate = self._gate
        active = gate.active
        active.append(None)
        if gate.blocking or self._closed:
            active.pop()
            return self._get_slow(key)
        try:
            txn = self.env.begin(db=self._data)
            try:
                return txn.get(key)
            finally:
                txn.abort()
        except lmdb.Error as exc:
            err = exc
        finally:
            active.pop()
        if isinstance(err, lmdb.MapResizedError):
            self._adopt_mapsize()
            return self.get(key)
        raise _read_error(err, self.path) from None

    def _get_slow(self, key: bytes) -> bytes | None:
        self._enter()
        try:
            with self.env.begin(db=self._data) as txn:
                return txn.get(key)
        except lmdb.Error as exc:
            err = exc
        finally:
            self._gate.exit()
        if isinstance(err, lmdb.MapResizedError):
            self._adopt_mapsize()
            return self.get(key)
        raise _read_error(err, self.path) from None

    def read_meta_applied(self) -> int:
        """The applied LSN as LMDB holds it now (read-only opens: the
        writer's progress)."""
        self._enter()
        try:
            try:
                with self.env.begin(db=self._meta) as txn:
                    v = txn.get(K_APPLIED)
            except lmdb.MapResizedError:
                self._gate.exit()
                self._adopt_mapsize()
                self._gate.enter()
                with self.env.begin(db=self._meta) as txn:
                    v = txn.get(K_APPLIED)
        finally:
            self._gate.exit()
        return _U64.unpack(v)[0] if v and len(v) == 8 else 0

    def count(self) -> int:
        self._enter()
        try:
            try:
                with self.env.begin() as txn:
                    return txn.stat(self._data)["entries"]
            except lmdb.MapResizedError:
                pass
        finally:
            self._gate.exit()
        self._adopt_mapsize()
        return self.count()

    def info(self) -> dict:
        self._enter()
        try:
            info = self.env.info()
            stat = self.env.stat()
            psize = stat["psize"]
            with self.env.begin() as txn:
                dstat = txn.stat(self._data)
        finally:
            self._gate.exit()
        return {
            "lmdb_map_bytes": info["map_size"],
            "lmdb_used_bytes": (info["last_pgno"] + 1) * psize,
            "lmdb_entries": dstat["entries"],
            "lmdb_depth": dstat["depth"],
            "lmdb_readers": info["num_readers"],
        }

    def scan(self, lo: bytes, hi: bytes | None, reverse: bool = False
             ) -> Iterator[tuple[bytes, bytes]]:
        """Yield (key, value) for ``lo <= key < hi`` (``hi`` None: no bound),
        ascending or descending.

        The scan reads from one LMDB read transaction (one consistent
        snapshot) in chunks, leaving LMDB between chunks so that it never
        blocks the writer; only if the map is grown meanwhile does it go on
        in a newer snapshot, from the key after the last one it yielded.
        Each key is yielded at most once, in strict order.
        """
        txn = None
        it = None
        last: bytes | None = None
        gen = -1
        n = 16
        try:
            while True:
                self._enter()
                try:
                    if gen != self.map_gen or txn is None:
                        if txn is not None:
                            try:
                                txn.abort()
                            except lmdb.Error:
                                pass
                        try:
                            txn = self.env.begin(db=self._data)
                        except lmdb.MapResizedError:
                            self._gate.exit()
                            self._adopt_mapsize()
                            self._gate.enter()
                            txn = self.env.begin(db=self._data)
                        gen = self.map_gen
                        it = _position(txn.cursor(), lo, hi, last, reverse)
                    chunk = list(islice(it, n)) if it is not None else []
                except lmdb.Error as exc:
                    raise _read_error(exc, self.path) from None
                finally:
                    self._gate.exit()
                if not chunk:
                    return
                if reverse:
                    for kv in chunk:
                        if kv[0] < lo:
                            return
                        yield kv
                elif hi is None:
                    yield from chunk
                else:
                    for kv in chunk:
                        if kv[0] >= hi:
                            return
                        yield kv
                if len(chunk) < n:
                    return
                last = chunk[-1][0]
                if n < 1024:
                    n *= 2
        finally:
            if txn is not None:
                self._gate.enter()
                try:
                    txn.abort()
                except lmdb.Error:
                    pass
                finally:
                    self._gate.exit()

    # -- lifecycle ----------------------------------------------------------

    def sync(self) -> None:
        """Flush LMDB to disk (not on the commit path; used at close)."""
        if not self.readonly:
            self.env.sync(True)

    def close(self, *, sync: bool = True) -> None:
        """Wait for readers to leave, flush (unless ``sync=False``) and close."""
        if self._closed:
            return
        gate = self._gate
        gate.acquire_exclusive()
        try:
            self._closed = True
            try:
                if sync and not self.readonly:
                    self.env.sync(True)
            finally:
                self.env.close()
        finally:
            gate.release_exclusive()

    @property
    def closed(self) -> bool:
        return self._closed


_MAXK = 511


def _seek_ge(cur: lmdb.Cursor, bound: bytes) -> bool:
    """Position at the first key >= ``bound`` (any length); False if none."""
    if not bound:
        return cur.first()
    if len(bound) <= _MAXK:
        return cur.set_range(bound)
    head = bound[:_MAXK]  # keys are <= 511 bytes: k >= bound iff k > head
    if not cur.set_range(head):
        return False
    return cur.next() if cur.key() == head else True


def _seek_lt(cur: lmdb.Cursor, bound: bytes | None) -> bool:
    """Position at the last key < ``bound`` (None: the last key); False if none."""
    if bound is None:
        return cur.last()
    if not bound:
        return False
    if len(bound) <= _MAXK:
        return cur.prev() if cur.set_range(bound) else cur.last()
    head = bound[:_MAXK]  # k < bound iff k <= head
    if not cur.set_range(head):
        return cur.last()
    return True if cur.key() == head else cur.prev()


def _position(cur: lmdb.Cursor, lo: bytes, hi: bytes | None, last: bytes | None,
              reverse: bool):
    """An LMDB cursor iterator at the first key of the scan (after ``last``,
    when resuming), or None when the range is empty."""
    if not reverse:
        if last is None:
            ok = _seek_ge(cur, lo)
        else:
            ok = cur.set_range(last) and (cur.key() != last or cur.next())
        return cur.iternext() if ok else None
    ok = _seek_lt(cur, last if last is not None else hi)
    return cur.iterprev() if ok else None


def _delete_range(txn: lmdb.Transaction, start: bytes, end: bytes) -> None:
    if start >= end:
        return
    cur = txn.cursor()
    if not _seek_ge(cur, start):
        return
    delete = cur.delete
    key = cur.key
    while True:
        k = key()
        if not k or k >= end:
            return
        delete()


def _read_error(exc: lmdb.Error, path: str) -> Exception:
    if isinstance(exc, lmdb.CorruptedError | lmdb.PageNotFoundError |
                  lmdb.PanicError | lmdb.DiskError):
        return CorruptionError(
            f"LMDB read failed: {exc}", path=path,
            hint="close the store and reopen it read-write: walkv rebuilds "
                 "LMDB from the log when it finds it damaged")
    if isinstance(exc, lmdb.ReadersFullError):
        return WalkvError(f"too many concurrent LMDB readers ({path}): {exc}")
    return WalkvError(f"LMDB read failed ({path}): {exc}")


def _preallocate(path: str, size: int) -> None:
    """Give ``data.mdb`` (already initialised by LMDB) real blocks up to
    ``size``: with MDB_WRITEMAP LMDB makes the file as long as the map but
    sparse, and a write to a hole on a full disk is a SIGBUS, while
    allocating here turns a full disk into an error."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", -1)):
                os.ftruncate(fd, size)  # no fallocate here; a sparse file it is
            elif exc.errno == errno.ENOSPC:
                raise LogFailedError(
                    f"no space to grow the LMDB map of {path} to {size >> 20} MiB; "
                    f"free space and reopen the store (every acknowledged "
                    f"write is in the log)") from None
            else:
                raise
    finally:
        os.close(fd)

