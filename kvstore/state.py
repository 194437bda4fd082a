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
for how readers and the writer share LMDB without a lock on the read path,
and :mod:`kvstore.state_reads` for the read side of this class.
"""

from __future__ import annotations

import logging
import operator
import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any, NamedTuple

import lmdb

from kvstore import conditions
from kvstore.batch import NO_WRITE_CODES, OP_DELETE, OP_PUT
from kvstore.lmdb_env import clear_stale_readers, grow_size, open_env, reader_table
from kvstore.lmdb_ops import delete_range, preallocate, put_run
from kvstore.state_reads import K_APPLIED, StateReads
from wal.errors import CorruptionError, Damage, LogFailedError, WalkvError
from wal.forkguard import track

log = logging.getLogger("walkv.state")

FORMAT = b"1"
K_FORMAT = b"walkv.format"
K_STORE_ID = b"walkv.store_id"
K_COMPLETE = b"walkv.complete"

DEFAULT_MAP_SIZE = 8 << 20
"""The initial LMDB map of a new environment: small (the log's preallocation
step), since with ``writemap`` the whole map is given real blocks
(:mod:`kvstore.lmdb_env`); it grows as the data does (:meth:`State.grow`).
Not smaller: a grow waits for open read views (a snapshot being written), so
a small store should rarely need one."""
MAX_GROW_STEP = 256 << 20
"""The map grows by its size (doubling) up to this step, then by this step:
at most this much is allocated ahead of the data."""
SWEEP_SECONDS = 1.0

_perf_counter = time.perf_counter
_U64 = struct.Struct("<Q")
_pack_u64 = _U64.pack
_first = operator.itemgetter(0)
_PUT_CODES = {OP_PUT}
Ops = Sequence[Sequence[Any]]
"""One log entry's operations, as :func:`kvstore.batch.decode` returns them."""


class StateOptions(NamedTuple):
    """How an LMDB environment is opened (see :mod:`kvstore.lmdb_env`)."""

    map_size: int = DEFAULT_MAP_SIZE
    writemap: bool = True
    max_readers: int = 1024


class State(StateReads):
    """The LMDB environment of one store, and its apply and read paths.

    Not the public API (that is :class:`kvstore.KVStore`).
    """

    def __init__(self, path: str, options: StateOptions = StateOptions(), *, readonly: bool = False) -> None:
        map_size, writemap, max_readers = options
        super().__init__(path)
        self.readonly = readonly
        self.writemap = writemap and not readonly
        self.map_grows = 0
        self._last_sweep = time.perf_counter()
        # counters (updated only by the applying thread)
        self.applied_groups = 0
        self.applied_entries = 0
        self.puts = 0
        self.deletes = 0
        self.delete_ranges = 0
        self.apply_seconds = 0.0
        self.apply_max_seconds = 0.0
        self.env, self.main_db, self.data_db = open_env(
            path, readonly=readonly, map_size=map_size, writemap=self.writemap,
            max_readers=max_readers)
        track(self)
        try:
            self._load_meta()
        except BaseException as exc:
            self.env.close()
            if isinstance(exc, lmdb.Error) and not isinstance(exc, WalkvError):
                raise CorruptionError(f"LMDB environment is unreadable: {exc}", kind=Damage.LMDB,
                                      path=path, offset=0) from None
            raise

    # -- meta ---------------------------------------------------------------

    def _load_meta(self) -> None:
        with self.env.begin(db=self.main_db) as txn:
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
        main = self.main_db

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
            def load(txn: lmdb.Transaction, items: list[tuple[bytes, bytes]] = items) -> None:
                txn.cursor(db=data).putmulti(items, dupdata=False, overwrite=True, append=False)
            self._with_write(load)
            n += len(items)
        main = self.main_db

        def finish(txn: lmdb.Transaction) -> None:
            txn.put(K_APPLIED, _pack_u64(base_lsn), db=main)
            txn.put(K_COMPLETE, b"1", db=main)
        self._with_write(finish)
        self.applied_lsn = base_lsn
        self.complete = True
        self.gen += 1
        return n

    # -- writing ------------------------------------------------------------

    def _with_write(self, fn: Callable[[lmdb.Transaction], object]) -> None:
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

    def apply(self, first_lsn: int, batches: Sequence[Ops]) -> None:
        """Apply log entries ``first_lsn, first_lsn + 1, ...`` (``batches[i]``
        is the operations of entry ``first_lsn + i``, decoded and validated)
        in ONE LMDB write transaction that also records the highest applied
        LSN. Entries at or below ``applied_lsn`` are skipped, so applying is
        idempotent."""
        if self._closed:
            raise self._closed_error()
        applied = self.applied_lsn
        last = first_lsn + len(batches) - 1
        if last <= applied:
            return
        if first_lsn <= applied:
            batches = batches[applied + 1 - first_lsn:]
        t0 = _perf_counter()
        flat = batches[0] if len(batches) == 1 else [op for ops in batches for op in ops]
        codes = set(map(_first, flat))
        puts_only = codes <= _PUT_CODES
        main = self.main_db
        while True:
            txn = self.env.begin(self.data_db, None, True)
            try:
                if puts_only:
                    if flat:
                        put_run(txn, flat)
                    puts, deletes, ranges = len(flat), 0, 0
                elif not codes.isdisjoint(NO_WRITE_CODES):  # conditional batches: decided in the log
                    puts, deletes, ranges = _apply_ops(
                        txn, [op for ops in batches for op in conditions.writes_of(ops)])
                else:
                    puts, deletes, ranges = _apply_ops(txn, flat)
                txn.put(K_APPLIED, _pack_u64(last), True, True, False, main)
                txn.commit()
            except lmdb.MapFullError:
                self.grow(txn)
                continue
            except lmdb.Error as exc:
                self._abort_write(txn)
                raise LogFailedError(
                    f"applying LSNs {applied + 1}..{last} to LMDB ({self.path}) "
                    f"failed: {exc}") from None
            except BaseException:
                self._abort_write(txn)
                raise
            break
        self.applied_lsn = last
        self.gen += 1
        t1 = _perf_counter()
        dt = t1 - t0
        self.applied_groups += 1
        self.applied_entries += len(batches)
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
            self.expire_views()
            clear_stale_readers(self.env)

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
        """Grow the map: double up to :data:`MAX_GROW_STEP`, then by that
        step; by less (at least 1 MiB) when only less fits on the file system,
        so a full disk fills up whatever the step and a replay after freeing
        a little space needs only that little (a transaction that still does
        not fit grows again); :class:`~wal.errors.DiskFullError` when not even
        1 MiB fits. ``failed`` is the write transaction that hit MDB_MAP_FULL,
        aborted here. Waits for
        readers to leave LMDB (py-lmdb's abort and remap wait for every call
        in flight, and would starve behind busy readers); their open
        transactions are invalidated (cached ones are renewed, scans
        re-seek). Stale readers (their processes died) are cleared first:
        when there were any, the failed transaction is only retried."""
        if clear_stale_readers(self.env) and failed is not None and not at_least:
            self._abort_write(failed)
            return
        old = self.env.info()["map_size"]
        try:
            new = grow_size(self.path, old, min(old, MAX_GROW_STEP), at_least)
        except BaseException:
            if failed is not None:
                self._abort_write(failed)
            raise
        gate = self.gate
        if failed is not None:
            self._abort_write(failed)
        self.exclusive_without_views()  # waits for open views (kvstore/view.py)
        try:
            if self.writemap:
                preallocate(os.path.join(self.path, "data.mdb"), new)
            self.env.set_mapsize(new)
            self.map_gen += 1
        finally:
            gate.release_exclusive()
        self.map_grows += 1
        log.info("LMDB map of %s grown from %d to %d MiB", self.path,
                 old >> 20, new >> 20)

    def stats(self) -> dict[str, int | float | None]:
        """What was applied and read (counters, approximate under concurrent
        use) and how LMDB looks now. Readers, from LMDB's reader table (every
        process's, this call's own read transaction included):
        ``lmdb_reader_slots`` slots in use, ``lmdb_readers_reading`` of them
        inside a read transaction, ``lmdb_oldest_reader_lag`` how many write
        transactions were committed since the snapshot the oldest of those
        sees (None: no reader). Pages those commits freed cannot be reused
        while it reads, so a lag that keeps growing means a reader holds a
        snapshot too long (an idle iterator, a long view) or died holding one
        (cleared within a second by the writer)."""
        data = self.data_db

        def read(txn: lmdb.Transaction) -> tuple:
            return txn.stat(data), self.env.info(), self.env.stat()["psize"], reader_table(self.env)
        dstat, info, psize, (slots, reading, oldest) = self._read(read)
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
            "lmdb_reader_slots": slots,
            "lmdb_readers_reading": reading,
            "lmdb_oldest_reader_lag": None if oldest is None else info["last_txnid"] - oldest,
        }

    # -- lifecycle ----------------------------------------------------------

    def close(self, *, sync: bool = True) -> None:
        """Wait for readers to leave, flush (unless ``sync=False``) and close."""
        if self._closed:
            return
        gate = self.gate
        gate.acquire_exclusive()
        try:
            self._close_views(every=True)
            self._closed = True
            try:
                if sync and not self.readonly:
                    self.env.sync(True)
            finally:
                self.env.close()
        finally:
            gate.release_exclusive()


class ReadOnlyState(State):
    """A state opened beside a writer in another process: every get takes a
    fresh read transaction (there is no local commit counter to cache
    against), and nothing is written."""

    def __init__(self, path: str, options: StateOptions = StateOptions()) -> None:
        super().__init__(path, options, readonly=True)

    get = StateReads._get_uncached


def _apply_ops(txn: lmdb.Transaction, ops: Ops) -> tuple[int, int, int]:
    """Apply operations in order inside ``txn``; return the numbers of puts,
    deletes and range deletes. Puts go to LMDB in runs, through one putmulti
    call each: py-lmdb releases the GIL on every call, and with another
    thread running Python each release costs a GIL hand-off (a put goes from
    ~1.5 to ~20 us), so calls are few."""
    run: list[Sequence[Any]] = []
    puts = deletes = ranges = 0
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
    if run:
        put_run(txn, run)
        puts += len(run)
    return puts, deletes, ranges
