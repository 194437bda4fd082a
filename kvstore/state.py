"""The state machine: an LMDB environment that the log's entries are applied to.

Layout of ``STORE/lmdb/`` (an LMDB environment directory)::

    data.mdb, lock.mdb   LMDB's own files
    SESSION              the session record (see kvstore/recovery.py)

Inside the environment:

* the named database ``data`` holds the user's keys and values, as given
  (LMDB's byte order: memcmp, shorter first);
* walkv's bookkeeping are plain keys of LMDB's main (unnamed) database, beside
  the record of ``data``. (Keeping them there rather than in a second named
  database saves a page copy per write transaction: the main database's leaf
  is rewritten by every commit anyway, for ``data``'s root.)

  ==================  ======================================================
  ``walkv.format``    ``b"1"``; another number is refused
  ``walkv.store_id``  the log's store id (hex); a mismatch means this LMDB
                      was built from another log, so it is rebuilt
  ``walkv.applied``   uint64 little-endian: every log entry up to this LSN
                      is applied, none after it. Written in the same write
                      transaction as the entries it covers, so LMDB's own
                      atomicity makes applying idempotent (replay skips
                      LSNs at or below it).
  ``walkv.complete``  ``b"1"`` once a rebuild's base (snapshot) load is
                      done; ``b"0"`` while it runs, so an interrupted
                      rebuild is redone
  ==================  ======================================================

Durability: LMDB is opened with ``sync=False, metasync=False``: its fsyncs are
not on the commit path, the log's are. A process crash cannot corrupt such an
environment (dirty pages live in the kernel's page cache), a machine crash can
(pages reach the disk in any order), so whether to trust it at open is decided
from the SESSION record (kvstore/recovery.py), never from LMDB's contents.
The other options, and why: :mod:`kvstore.lmdb_env`.

Concurrency: one thread at a time applies (the log's committing thread, or the
opener while replaying); any number of threads read, each through its own
cached read transaction (a get is one LMDB lookup); see :mod:`kvstore.readers`
for how readers and the writer share LMDB without a lock on the read path.
"""

from __future__ import annotations

import logging
import operator
import os
import struct
import threading
import time
import weakref
from itertools import islice
from typing import Generator, Iterator

import lmdb
import msgpack

from kvstore.batch import OP_DELETE, OP_PUT, as_bytes, decode
from kvstore.lmdb_env import open_env
from kvstore.lmdb_ops import delete_range, preallocate, put_run, read_error
from kvstore.readers import Reader, ReadGate, ReadView
from kvstore.readers import scan as _scan
from wal.errors import ClosedError, CorruptionError, LogFailedError, WalkvError

log = logging.getLogger("walkv.state")

FORMAT = b"1"
K_FORMAT = b"walkv.format"
K_STORE_ID = b"walkv.store_id"
K_APPLIED = b"walkv.applied"
K_COMPLETE = b"walkv.complete"

DEFAULT_MAP_SIZE = 64 << 20
_GROW_DOUBLE_UNTIL = 1 << 30
SWEEP_SECONDS = 1.0

_perf_counter = time.perf_counter
_get_ident = threading.get_ident
_U64 = struct.Struct("<Q")
_pack_u64 = _U64.pack
_unpackb = msgpack.unpackb


def _identity(x):
    return x


_first = operator.itemgetter(0)
_PUT_CODES = {OP_PUT}
_NO_HITS: dict = {}
_MAX_KNOWN = 1 << 16


class State:
    """The LMDB environment of one store, and its apply and read paths.

    Not the public API (that is :class:`kvstore.KVStore`).
    """

    def __init__(self, path: str, *, readonly: bool = False,
                 map_size: int = DEFAULT_MAP_SIZE, writemap: bool = True,
                 max_readers: int = 1024) -> None:
        self.path = path
        self.readonly = readonly
        self.writemap = writemap and not readonly
        self._closed = False
        self.gen = 0              # bumped after every commit and remap
        self.map_gen = 0          # bumped whenever open transactions die
        self.map_grows = 0
        self._local = threading.local()
        self._readers: weakref.WeakSet[Reader] = weakref.WeakSet()
        self._readers_lock = threading.Lock()
        self.dead_gets = 0
        self.gate = ReadGate(self._reader_list, self._on_block, self._on_release)
        self._held_gen = 0
        self._r0 = Reader(None)  # the last reading thread's reader (fast path)
        # id(payload) -> (payload, ops, puts_only) for entries this process
        # encoded: the apply path takes the ops from here instead of
        # decoding the payload it was just given back.
        self.decoded: dict[int, tuple[bytes, list, bool]] = {}
        self._last_sweep = time.perf_counter()
        # counters (updated only by the applying thread)
        self.applied_groups = 0
        self.applied_entries = 0
        self.puts = 0
        self.deletes = 0
        self.delete_ranges = 0
        self.apply_seconds = 0.0
        self.apply_max_seconds = 0.0
        self.env, self._main, self.data_db = open_env(
            path, readonly=readonly, map_size=map_size, writemap=self.writemap,
            max_readers=max_readers)
        try:
            self._load_meta()
        except BaseException as exc:
            self.env.close()
            if isinstance(exc, lmdb.Error) and not isinstance(exc, WalkvError):
                raise CorruptionError(f"LMDB environment is unreadable: {exc}",
                                      path=path) from None
            raise
        if readonly:
            self.get = self._get_uncached  # type: ignore[method-assign]

    # -- meta ---------------------------------------------------------------

    def _load_meta(self) -> None:
        with self.env.begin(db=self._main) as txn:
            fmt = txn.get(K_FORMAT)
            sid = txn.get(K_STORE_ID)
            applied = txn.get(K_APPLIED)
            complete = txn.get(K_COMPLETE)
        if fmt is not None and fmt != FORMAT:
            raise WalkvError(f"{self.path}: LMDB state format {fmt!r} is not this "
                             f"walkv's ({FORMAT!r}); use the walkv that wrote it")
        self.store_id = sid.decode("ascii", "replace") if sid else None
        self.applied_lsn = _U64.unpack(applied)[0] if applied and len(applied) == 8 else 0
        self.complete = complete == b"1"
        self.initialized = fmt is not None

    def initialize(self, store_id: str, base_lsn: int = 0, *, complete: bool) -> None:
        """Write the meta of a fresh (or rebuilding) environment."""
        main = self._main

        def write(txn: lmdb.Transaction) -> None:
            txn.put(K_FORMAT, FORMAT, db=main)
            txn.put(K_STORE_ID, store_id.encode("ascii"), db=main)
            txn.put(K_APPLIED, _pack_u64(base_lsn), db=main)
            txn.put(K_COMPLETE, b"1" if complete else b"0", db=main)
        self._with_write(write)
        self.store_id = store_id
        self.applied_lsn = base_lsn
        self.complete = complete
        self.initialized = True
        self.gen += 1

    def load_base(self, pairs: Iterator[tuple[bytes, bytes]], base_lsn: int,
                  chunk: int = 10000) -> int:
        """Bulk-load (key, value) pairs sorted by key, then mark the
        environment complete at ``base_lsn``. Returns the number loaded."""
        n = 0
        it = iter(pairs)
        data = self.data_db
        while True:
            items = list(islice(it, chunk))
            if not items:
                break
            self._with_write(lambda txn: txn.cursor(db=data).putmulti(
                items, dupdata=False, overwrite=True, append=False))
            n += len(items)
        main = self._main

        def finish(txn: lmdb.Transaction) -> None:
            txn.put(K_APPLIED, _pack_u64(base_lsn), db=main)
            txn.put(K_COMPLETE, b"1", db=main)
        self._with_write(finish)
        self.applied_lsn = base_lsn
        self.complete = True
        self.gen += 1
        return n

    # -- writing ------------------------------------------------------------

    def _with_write(self, fn) -> None:
        """Run ``fn(txn)`` in one write transaction, growing the map and
        retrying as often as it fills."""
        while True:
            txn = self.env.begin(write=True, db=self.data_db)
            try:
                fn(txn)
                txn.commit()
                return
            except lmdb.MapFullError:
                self.grow(txn)
            except BaseException:
                self._abort_write(txn)
                raise

    def apply(self, entries: list, *, strict: bool = False, decoded: bool = False) -> None:
        """Apply a group of log entries (in LSN order) in ONE LMDB write
        transaction that also records the highest applied LSN. Entries at or
        below ``applied_lsn`` are skipped, so applying is idempotent.

        ``strict`` validates every payload (:func:`kvstore.batch.decode`)
        before the transaction starts, so a corrupt entry writes nothing. The
        live path passes entries this process encoded and validated itself.
        ``decoded``: the entries are ``(lsn, ops)``, already decoded by
        :func:`~kvstore.batch.decode` (replay does that as it reads).
        """
        if self._closed:
            raise self._closed_error()
        if not entries or entries[-1][0] <= self.applied_lsn:
            return
        t0 = _perf_counter()
        applied = self.applied_lsn
        if decoded:
            dec = _identity
            known = _NO_HITS
        elif strict:
            entries = [(lsn, decode(p, lsn)) for lsn, p in entries if lsn > applied]
            dec = _identity
            known = _NO_HITS
        else:
            dec = _unpackb
            known = self.decoded
            if len(known) > _MAX_KNOWN:  # payloads the log never handed back
                known.clear()
        main = self._main
        begin = self.env.begin
        data = self.data_db
        flat = None
        if dec is _identity:  # decoded: if every op is a put, one putmulti
            if entries[0][0] <= applied:
                entries = [e for e in entries if e[0] > applied]
            flat = [op for _, ops in entries for op in ops]
            if not set(map(_first, flat)) <= _PUT_CODES:
                flat = None
        while True:
            puts = 0
            txn = begin(data, None, True)
            try:
                if flat is not None:
                    if flat:
                        put_run(txn, flat)
                    puts = len(flat)
                    deletes = ranges = 0
                    n = len(entries)
                    last = entries[-1][0]
                    txn.put(K_APPLIED, _pack_u64(last), True, True, False, main)
                    txn.commit()
                    break
                # Puts go to LMDB in runs, through one putmulti call each:
                # py-lmdb releases the GIL on every call, and with another
                # thread running Python each release costs a GIL hand-off
                # (a put goes from ~1.5 to ~20 us), so calls are few.
                run: list = []
                deletes = ranges = n = 0
                last = applied
                for lsn, payload in entries:
                    if lsn <= applied:
                        continue
                    hit = known.pop(id(payload), None)
                    if hit is not None and hit[0] is payload:
                        ops = hit[1]
                        if hit[2]:  # only puts
                            run.extend(ops)
                            last = lsn
                            n += 1
                            continue
                    else:
                        ops = dec(payload)
                    for op in ops:
                        code = op[0]
                        if code == OP_PUT:
                            run.append(op)
                            continue
                        if run:
                            put_run(txn, run)
                            puts += len(run)
                            run = []
                        if code == OP_DELETE:
                            txn.delete(op[1])
                            deletes += 1
                        else:
                            delete_range(txn, op[1], op[2])
                            ranges += 1
                    last = lsn
                    n += 1
                if run:
                    put_run(txn, run)
                    puts += len(run)
                put = txn.put
                put(K_APPLIED, _pack_u64(last), True, True, False, main)
                txn.commit()
            except lmdb.MapFullError:
                self.grow(txn)
                continue
            except lmdb.Error as exc:
                self._abort_write(txn)
                raise LogFailedError(
                    f"applying LSNs {applied + 1}..{entries[-1][0]} to LMDB ({self.path}) "
                    f"failed: {exc}. Every acknowledged write is in the log; "
                    f"close and reopen the store to go on.") from None
            except BaseException:
                self._abort_write(txn)
                raise
            break
        self.applied_lsn = last
        self.gen += 1
        t1 = _perf_counter()
        dt = t1 - t0
        self.applied_groups += 1
        self.applied_entries += n
        self.puts += puts
        if deletes or ranges:
            self.deletes += deletes
            self.delete_ranges += ranges
        self.apply_seconds += dt
        if dt > self.apply_max_seconds:
            self.apply_max_seconds = dt
        if t1 - self._last_sweep > SWEEP_SECONDS:
            self._last_sweep = t1
            self._sweep()

    def _abort_write(self, txn: lmdb.Transaction) -> None:
        """Abort a write transaction with readers held out of LMDB (py-lmdb's
        abort waits for every call in flight and starves behind busy
        readers)."""
        gate = self.gate
        gate.acquire_exclusive()
        try:
            txn.abort()
        finally:
            gate.release_exclusive()

    def grow(self, failed: lmdb.Transaction | None = None, at_least: int = 0) -> None:
        """Grow the map: double up to 1 GiB, then by half. ``failed`` is the
        write transaction that hit MDB_MAP_FULL, aborted here. Waits for
        readers to leave LMDB (py-lmdb's abort and remap wait for every call
        in flight, and would starve behind busy readers); their open
        transactions are invalidated (cached ones are renewed, scans
        re-seek)."""
        old = self.env.info()["map_size"]
        new = old * 2 if old < _GROW_DOUBLE_UNTIL else old + old // 2
        new = max(new, at_least)
        new = (new + 0xFFFFF) & ~0xFFFFF
        gate = self.gate
        gate.acquire_exclusive()
        try:
            if failed is not None:
                failed.abort()
            if self.writemap:
                preallocate(os.path.join(self.path, "data.mdb"), new)
            self.env.set_mapsize(new)
            self.map_gen += 1
        finally:
            gate.release_exclusive()
        self.map_grows += 1
        log.info("LMDB map of %s grown from %d to %d MiB", self.path,
                 old >> 20, new >> 20)

    def adopt_mapsize(self) -> None:
        """Read-only: another process grew the map; adopt its size."""
        gate = self.gate
        gate.acquire_exclusive()
        try:
            self.env.set_mapsize(0)
            self.map_gen += 1
        finally:
            gate.release_exclusive()

    def _reader_list(self) -> list[Reader]:
        with self._readers_lock:
            return list(self._readers)

    def _sweep(self) -> None:
        """Drop cached read transactions older than the newest commit, so an
        idle reading thread does not pin old pages."""
        readers = self._reader_list()
        gen = self.gen
        if not any(r.txn is not None and r.gen != gen for r in readers):
            return
        gate = self.gate
        gate.acquire_exclusive(cached_only=True)
        try:
            for r in readers:
                if r.txn is not None and r.gen != gen:
                    try:
                        r.txn.abort()
                    except lmdb.Error:
                        pass
                    r.txn = None
                    r.gen = -1
        finally:
            gate.release_exclusive()

    # -- reading ------------------------------------------------------------

    def _on_block(self) -> None:
        # A writer wants LMDB to itself: no cached transaction matches -2.
        self._held_gen = self.gen
        self.gen = -2

    def _on_release(self) -> None:
        # Every cached transaction predates what the writer did: renew.
        self.gen = self._held_gen + 1

    def _reader(self) -> Reader:
        """This thread's reader (created and registered on first use)."""
        try:
            return self._local.r
        except AttributeError:
            pass
        r = Reader(self, _get_ident())
        self._local.r = r
        with self._readers_lock:
            self._readers.add(r)
        return r

    def _renew(self, r: Reader) -> lmdb.Transaction:
        gen = self.gen  # read before begin: never record a newer gen than the snapshot
        t = r.txn
        if t is not None:
            r.txn = None
            try:
                t.abort()
            except lmdb.Error:
                pass
        t = r.txn = self.env.begin(db=self.data_db)
        r.gen = gen
        return t

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` or ``default``; sees every group applied
        before it was called."""
        if type(key) is not bytes:
            key = as_bytes(key, "key")
        r = self._r0
        if r.ident != _get_ident():
            r = self._r0 = self._reader()  # the last thread to read goes fast
        r.busy = True
        try:
            if r.gen == self.gen:
                r.gets += 1
                return r.txn.get(key, default)  # type: ignore[union-attr]
        except lmdb.BadValsizeError:
            return default  # an empty or over-long key: no such key can exist
        except lmdb.Error:
            pass
        finally:
            r.busy = False
        return self._get_slow(r, key, default)

    def _get_slow(self, r: Reader, key: bytes, default: bytes | None) -> bytes | None:
        """A commit happened since this thread's last read, or a writer holds
        the gate, or the cached transaction died: renew it (announced by the
        reader's ``busy`` flag, as on the fast path)."""
        gate = self.gate
        while True:
            r.busy = True
            if not gate.blocking:
                break
            r.busy = False
            gate.wait()
        try:
            if self._closed:
                raise self._closed_error()
            txn = self._renew(r) if r.gen != self.gen or r.txn is None else r.txn
            r.gets += 1
            return txn.get(key, default)
        except lmdb.BadValsizeError:
            return default
        except lmdb.Error as exc:
            if self._closed:
                raise self._closed_error() from None
            raise read_error(exc, self.path) from None
        finally:
            r.busy = False

    def _plain_get(self, key: bytes, default: bytes | None) -> bytes | None:
        try:
            txn = self.env.begin(db=self.data_db)
            try:
                v = txn.get(key)
            finally:
                txn.abort()
        except lmdb.BadValsizeError:
            return default
        except lmdb.MapResizedError:
            raise
        except lmdb.Error as exc:
            raise read_error(exc, self.path) from None
        return default if v is None else v

    def _get_uncached(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """Read-only opens: a fresh read transaction per get (another process
        writes, so there is no commit counter to cache against)."""
        if type(key) is not bytes:
            key = as_bytes(key, "key")
        for attempt in (0, 1):
            self.enter_read()
            try:
                return self._plain_get(key, default)
            except lmdb.MapResizedError as exc:
                if attempt:
                    raise read_error(exc, self.path) from None
            finally:
                self.gate.exit()
            self.adopt_mapsize()  # the writer grew the map
        raise AssertionError("unreachable")

    @property
    def gets(self) -> int:
        with self._readers_lock:
            return self.dead_gets + sum(r.gets for r in self._readers)

    def enter_read(self) -> None:
        gate = self.gate
        gate.enter()
        if self._closed:
            gate.exit()
            raise self._closed_error()

    def _read(self, fn):
        """``fn(txn)`` in a fresh read transaction, inside the gate."""
        for attempt in (0, 1):
            self.enter_read()
            try:
                try:
                    with self.env.begin(db=self.data_db) as txn:
                        return fn(txn)
                except lmdb.MapResizedError:
                    if attempt:
                        raise
                except lmdb.Error as exc:
                    raise read_error(exc, self.path) from None
            finally:
                self.gate.exit()
            self.adopt_mapsize()
        raise AssertionError("unreachable")

    def read_meta_applied(self) -> int:
        """The applied LSN as LMDB holds it now (read-only opens: the
        writer's progress)."""
        return self._read(self.applied_in)

    def applied_in(self, txn: lmdb.Transaction) -> int:
        """The applied LSN recorded in ``txn``'s snapshot of LMDB."""
        v = txn.get(K_APPLIED, db=self._main)
        return _U64.unpack(v)[0] if v and len(v) == 8 else 0

    def read_view(self) -> ReadView:
        """The state at one LSN, from one read transaction: ``.lsn``,
        ``.count``, ``.pairs()`` (see :class:`kvstore.readers.ReadView`).
        Use as a context manager; it holds off map growth while open."""
        return ReadView(self)

    def count(self) -> int:
        data = self.data_db
        return self._read(lambda txn: txn.stat(data)["entries"])

    def stats(self) -> dict[str, int | float]:
        """What was applied and read (counters, approximate under concurrent
        use) and how LMDB looks now."""
        data = self.data_db

        def read(txn: lmdb.Transaction) -> tuple:
            return txn.stat(data), self.env.info(), self.env.stat()["psize"]
        dstat, info, psize = self._read(read)
        groups = self.applied_groups
        return {
            "puts": self.puts,
            "deletes": self.deletes,
            "delete_ranges": self.delete_ranges,
            "gets": self.gets,
            "applied_entries": self.applied_entries,
            "applied_groups": groups,
            "apply_avg_us": self.apply_seconds / groups * 1e6 if groups else 0.0,
            "apply_max_us": self.apply_max_seconds * 1e6,
            "map_grows": self.map_grows,
            "lmdb_map_bytes": info["map_size"],
            "lmdb_used_bytes": (info["last_pgno"] + 1) * psize,
            "lmdb_entries": dstat["entries"],
            "lmdb_depth": dstat["depth"],
            "lmdb_readers": info["num_readers"],
        }

    def scan(self, lo: bytes, hi: bytes | None, reverse: bool = False
             ) -> Generator[tuple[bytes, bytes], None, None]:
        """See :func:`kvstore.readers.scan`."""
        return _scan(self, lo, hi, reverse)

    # -- lifecycle ----------------------------------------------------------

    def close(self, *, sync: bool = True) -> None:
        """Wait for readers to leave, flush (unless ``sync=False``) and close."""
        if self._closed:
            return
        gate = self.gate
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

    def _closed_error(self) -> ClosedError:
        return ClosedError(f"the store {os.path.dirname(self.path)} is closed")

    @property
    def closed(self) -> bool:
        return self._closed
