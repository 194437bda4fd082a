"""The state machine: an LMDB environment that the log's entries are applied to.

Layout of ``STORE/lmdb/`` (an LMDB environment directory)::

    data.mdb, lock.mdb   LMDB's own files
    SESSION              the session record (see kvstore/store/recovery.py)

Inside the environment:

* the named database ``data`` holds the user's keys and values, as given
  (LMDB's byte order: memcmp, shorter first): the default keyspace;
* the named database ``ks:<name>`` holds keyspace ``name``'s (created by
  the first write into it, emptied by its drop: a keyspace exists while it
  holds a key, so a rebuild from a snapshot, which leaves out empty ones,
  lists the same keyspaces). Why named databases and not a key prefix in
  ``data``: :mod:`kvstore.store.keyspace`;
* the named databases ``ttl:...`` and ``lease:...`` hold each key's expiry
  (a key of any keyspace) and the leases (:mod:`kvstore.state.expiry`);
* walkv's bookkeeping are plain keys of LMDB's main (unnamed) database, beside
  the record of ``data``. (Keeping them there rather than in a second named
  database saves a page copy per write transaction: the main database's leaf
  is rewritten by every commit anyway, for ``data``'s root.)

  ==================  ======================================================
  ``walkv.format``    ``b"1"``; another number is refused
  ``walkv.store_id``  the log's store id (hex); a mismatch means this LMDB
                      was built from another log, so it is rebuilt
  ``walkv.applied``   uint64 little-endian: every log entry up to this LSN
                      is in LMDB, none after it. Written in the same write
                      transaction as the entries it covers, so LMDB's own
                      atomicity makes applying idempotent (replay skips
                      LSNs at or below it). Entries after it may be applied
                      in memory only, in the overlay (:mod:`kvstore.state.overlay`):
                      ``State.applied_lsn`` is what this process's reads see,
                      ``State.lmdb_applied_lsn`` what LMDB holds.
  ``walkv.complete``  ``b"1"`` once a rebuild's base (snapshot) load is
                      done; ``b"0"`` while it runs, so an interrupted
                      rebuild is redone
  ==================  ======================================================

Durability: LMDB is opened with ``sync=False, metasync=False``: its fsyncs are
not on the commit path, the log's are. A process crash cannot corrupt such an
environment (dirty pages live in the kernel's page cache), a machine crash can
(pages reach the disk in any order), so whether to trust it at open is decided
from the SESSION record (kvstore/store/recovery.py), never from LMDB's contents.
The other options, and why: :mod:`kvstore.state.lmdb_env`.

Concurrency: one thread at a time applies (the log's committing thread, or the
opener while replaying); the overlay is written to LMDB by whichever thread
flushes it, one flush at a time; any number of threads read, each through its own
cached read transaction (a get is one LMDB lookup); see :mod:`kvstore.state.readers`
for how readers and the writer share LMDB without a lock on the read path.

:class:`State` owns the meta, applying and flushing, and has the parts it
delegates to: the environment (:mod:`kvstore.state.environment`), the overlay
and a read path (:mod:`kvstore.state.reads`).
"""

from __future__ import annotations

import logging
import operator
import struct
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from functools import partial
from itertools import islice
from typing import Any, Final, NamedTuple

import lmdb

from kvstore.entry import conditions
from kvstore.entry.codec import (
    DEFAULT_KEYSPACE,
    EXPIRY_CODES,
    KEYSPACE_CODES,
    KEYSPACE_SECTION,
    NO_WRITE_CODES,
    OP_DELETE,
    OP_EXPIRE,
    OP_KEYSPACE,
    OP_PUT,
    PUT_CODES,
    as_bytes,
)
from kvstore.state.environment import K_APPLIED, Environment
from kvstore.state.expiry import DB_NAMES as EXPIRY_DBS
from kvstore.state.expiry import Expiry
from kvstore.state.lmdb_ops import apply_ops, put_run, write_values
from kvstore.state.overlay import MISSING, Overlay
from kvstore.state.readers import ReadView, scan
from kvstore.state.reads import CachedReads, FreshReads, Get, read_in
from kvstore.state.view import ABSENT, View
from wal.errors import CorruptionError, Damage, LogFailedError, SnapshotError, WalkvError
from wal.segment import Payload, payload_size

log = logging.getLogger("walkv.state")

FORMAT: Final = b"1"
K_FORMAT: Final = b"walkv.format"
K_STORE_ID: Final = b"walkv.store_id"
K_COMPLETE: Final = b"walkv.complete"

DEFAULT_MAP_SIZE: Final = 8 << 20
"""The initial LMDB map of a new environment: small (the log's preallocation
step), since with ``writemap`` the whole map is given real blocks
(:mod:`kvstore.state.lmdb_env`); it grows as the data does
(:meth:`kvstore.state.environment.Environment.grow`). Not smaller: a grow
waits for open read views (a snapshot being written), so a small store
should rarely need one."""

_U64: Final = struct.Struct("<Q")
_pack_u64: Final = _U64.pack
_first: Final = operator.itemgetter(0)
_PUT_CODES: Final = {OP_PUT}
_OVERLAY_CODES: Final = {OP_PUT, OP_DELETE}
_TO_DEFAULT = (OP_KEYSPACE, DEFAULT_KEYSPACE)


def _now_us() -> int:
    """Microseconds since the epoch, UTC: the clock expiry is read against by default."""
    return time.time_ns() // 1000
DIRECT_OPS: Final = 4096
"""A group of at least this many operations is written to LMDB at once (with
the overlay) rather than through the overlay: it is a bulk write already."""
Ops = Sequence[Sequence[Any]]
"""One log entry's operations, as :func:`kvstore.entry.codec.decode` returns them."""


def _nothing() -> Generator[tuple[bytes, bytes], None, None]:
    yield from ()


class StateOptions(NamedTuple):
    """How an LMDB environment is opened (see :mod:`kvstore.state.lmdb_env`)."""

    map_size: int = DEFAULT_MAP_SIZE
    writemap: bool = True
    max_readers: int = 1024
    overlay: bool = False
    """Apply small groups through the overlay (:mod:`kvstore.state.overlay`): the
    store's ``overlay`` option (on by default)."""


class State:
    """The state machine of one store: its LMDB environment, its apply and
    read paths (see the module docstring). ``readonly``: opened beside a
    writer in another process; nothing is written, every get takes a fresh
    read transaction.

    Not the public API (that is :class:`kvstore.KVStore`).
    """

    def __init__(self, path: str, options: StateOptions = StateOptions(), *, readonly: bool = False) -> None:
        map_size, writemap, max_readers, overlay = options
        self.path = path
        self.readonly = readonly
        self.use_overlay = overlay and not readonly
        self.overlay = Overlay(self._overlay_occupied)  # applied, not yet in LMDB (kvstore/state/overlay.py)
        # counters (updated only by the applying thread)
        self.applied_groups = 0
        self.applied_entries = 0
        self.puts = 0
        self.deletes = 0
        self.delete_ranges = 0
        self.lmdb_commits = 0      # write transactions that applied entries (or the overlay)
        self.apply_seconds = 0.0   # ... and their time
        self.apply_max_seconds = 0.0
        self._failure: Exception | None = None  # a flush that failed (raised by every later apply)
        # LMDB, shared by reading threads and the writer (kvstore/state/environment.py)
        self.lmdb = Environment(path, readonly=readonly, map_size=map_size, writemap=writemap,
                                max_readers=max_readers)
        try:
            self._load_meta()
        except BaseException as exc:
            self.lmdb.close(sync=False)
            if isinstance(exc, lmdb.Error) and not isinstance(exc, WalkvError):
                raise CorruptionError(f"LMDB environment is unreadable: {exc}", kind=Damage.LMDB,
                                      path=path, offset=0) from None
            raise
        # The read path, chosen once (kvstore/state/reads.py). Its get and
        # get_many are exposed as they are, bound methods rather than State
        # methods that call them, so that a get costs no extra Python call:
        # the store calls state.get once per user get. While the overlay is
        # empty, get is the LMDB-only one (_overlay_occupied switches); while
        # a key has an expiry, the one that checks it (_reads_for_expiry).
        self.get: Get
        self.expiry = Expiry(self.lmdb.env, readonly=readonly)
        self.now_us: Callable[[], int] = _now_us
        """The clock reads compare expiry instants with (the store sets its own)."""
        self._reads: CachedReads | FreshReads
        self._plain_get: Get
        self._plain_get_many: Callable[..., list[bytes | None]]
        self.get_many: Callable[..., list[bytes | None]]
        if readonly:
            self._reads = fresh = FreshReads(self.lmdb)
            self._plain_get = fresh.get
            self._plain_get_many, self._get_in = fresh.get_many, fresh.get_in
        else:
            self._reads = cached = CachedReads(self.lmdb, self.overlay)
            self._plain_get = cached.get_lmdb
            self._plain_get_many, self._get_in = cached.get_many, cached.get_in
        self.get, self.get_many = self._plain_get, self._plain_get_many
        self._checking = False  # get is _get_alive (a key has an expiry)
        self._reads_for_expiry()
        if self.use_overlay:
            self.overlay.start(self.flush)

    def _overlay_occupied(self, occupied: bool) -> None:
        """The overlay took its first write (``occupied``) or a flush left it
        empty (called under its lock, :mod:`kvstore.state.overlay`): gets look
        in it, or go straight to LMDB."""
        reads = self._reads
        assert isinstance(reads, CachedReads), "only a read-write open has an overlay"
        self._plain_get = reads.get if occupied else reads.get_lmdb
        if not self._checking:
            self.get = self._plain_get

    # -- meta ---------------------------------------------------------------

    def _load_meta(self) -> None:
        with self.lmdb.env.begin(db=self.lmdb.main_db) as txn:
            fmt = txn.get(K_FORMAT)
            sid = txn.get(K_STORE_ID)
            applied = txn.get(K_APPLIED)
            complete = txn.get(K_COMPLETE)
        if fmt is not None and fmt != FORMAT:
            raise WalkvError(f"{self.path}: LMDB state format {fmt!r} is not this "
                             f"walkv's ({FORMAT!r}); use the walkv that wrote it")
        self.store_id = sid.decode("ascii", "replace") if sid else None
        self.applied_lsn = _U64.unpack(applied)[0] if applied and len(applied) == 8 else 0
        self.lmdb_applied_lsn = self.applied_lsn
        self.complete = complete == b"1"
        self.initialized = fmt is not None

    def initialize(self, store_id: str, base_lsn: int = 0, *, complete: bool) -> None:
        """Write the meta of a fresh (or rebuilding) environment."""
        main = self.lmdb.main_db

        def write(txn: lmdb.Transaction) -> None:
            txn.put(K_FORMAT, FORMAT, db=main)
            txn.put(K_STORE_ID, store_id.encode("ascii"), db=main)
            txn.put(K_APPLIED, _pack_u64(base_lsn), db=main)
            txn.put(K_COMPLETE, b"1" if complete else b"0", db=main)
        self.lmdb.write(write)
        self.store_id = store_id
        self.applied_lsn = self.lmdb_applied_lsn = base_lsn
        self.complete = complete
        self.initialized = True

    def load_base(self, pairs: Iterator[tuple[bytes, bytes]], base_lsn: int,
                  chunk: int = 10000, *, sections: Mapping[str, Iterable[tuple[bytes, bytes]]] | None = None) -> int:
        """Bulk-load (key, value) pairs sorted by key, each keyspace's
        (``sections``: a snapshot's, ``"ks:<name>"`` -> pairs) and the expiry
        metadata's sections (:mod:`kvstore.state.expiry`), then mark the
        environment complete at ``base_lsn``. Returns the number of pairs
        loaded. A section this version does not know is a
        :class:`~wal.errors.SnapshotError` (a newer walkv wrote it)."""
        runs: list[tuple[str, Iterable[tuple[bytes, bytes]]]] = [(DEFAULT_KEYSPACE, pairs)]
        metadata: list[tuple[str, Iterable[tuple[bytes, bytes]]]] = []
        for name, section in sorted((sections or {}).items()):
            if name.startswith(KEYSPACE_SECTION):
                runs.append((name[len(KEYSPACE_SECTION):], section))
            elif name in EXPIRY_DBS:
                metadata.append((name, section))
            else:
                raise SnapshotError(f"the snapshot holds a section {name!r} this walkv does not know "
                                    f"(a newer walkv wrote it): use that walkv to restore it")
        n = 0
        for keyspace, run in runs:
            it = iter(run)
            while True:
                items = list(islice(it, chunk))
                if not items:
                    break

                def load(txn: lmdb.Transaction, items: list[tuple[bytes, bytes]] = items,
                         keyspace: str = keyspace) -> None:
                    db = self.lmdb.keyspace_db_in(txn, keyspace)
                    txn.cursor(db=db).putmulti(items, dupdata=False, overwrite=True, append=False)
                self.lmdb.write(load)
                n += len(items)
        for name, section in metadata:
            rest = iter(section)
            while True:
                items = list(islice(rest, chunk))
                if not items:
                    break
                self.lmdb.write(partial(self.expiry.load, name=name, pairs=items))
        self._reads_for_expiry()
        main = self.lmdb.main_db

        def finish(txn: lmdb.Transaction) -> None:
            txn.put(K_APPLIED, _pack_u64(base_lsn), db=main)
            txn.put(K_COMPLETE, b"1", db=main)
        self.lmdb.write(finish)
        self.applied_lsn = self.lmdb_applied_lsn = base_lsn
        self.complete = True
        return n

    # -- writing ------------------------------------------------------------

    def apply(self, first_lsn: int, batches: Sequence[Ops], payloads: Sequence[Payload] = ()) -> None:
        """Apply log entries ``first_lsn, first_lsn + 1, ...`` (``batches[i]``
        is the operations of entry ``first_lsn + i``, decoded and validated):
        visible to every read in this process on return. With the overlay on
        (:attr:`StateOptions.overlay`), a group of fewer than
        :data:`DIRECT_OPS` puts and deletes goes into it
        (:mod:`kvstore.state.overlay`, written to LMDB later in bulk); anything
        else is written to LMDB now, after the overlay, in ONE write
        transaction that also records the highest applied LSN. Entries at or
        below ``applied_lsn`` are skipped, so applying is idempotent. A flush
        that failed earlier (a full disk) is raised here, so the log fails
        at the next group. ``payloads``: the entries as logged, whose size
        tells a big write to grow the map ahead
        (:meth:`kvstore.state.environment.Environment.make_room`)."""
        if self.lmdb.closed:
            raise self.lmdb.closed_error()
        if self._failure is not None:
            raise self._failure
        applied = self.applied_lsn
        last = first_lsn + len(batches) - 1
        if last <= applied:
            return
        if first_lsn <= applied:
            batches = batches[applied + 1 - first_lsn:]
        if len(batches) == 1 and len(batches[0]) == 1 and self.use_overlay:
            code = batches[0][0][0]
            if code == OP_PUT or code == OP_DELETE:  # the common group: one put or delete
                self.applied_groups += 1
                self.applied_entries += 1
                if code == OP_PUT:
                    self.puts += 1
                else:
                    self.deletes += 1
                self._to_overlay(batches[0], last)
                return
        flat = batches[0] if len(batches) == 1 else [op for ops in batches for op in ops]
        codes = set(map(_first, flat))
        if not codes.isdisjoint(KEYSPACE_CODES):  # keyspaces: a separate branch, op by op
            self._apply_keyspaces(batches, last, payloads)
            return
        if not codes.isdisjoint(NO_WRITE_CODES):  # conditional batches: decided in the log
            flat = [op for ops in batches for op in conditions.writes_of(ops)]
            codes = set(map(_first, flat))
        self.applied_groups += 1
        self.applied_entries += len(batches)
        if codes == _PUT_CODES:
            self.puts += len(flat)
        else:
            self._count(flat)
        if not codes.isdisjoint(EXPIRY_CODES):
            self._write_through(flat, last, 0, puts_only=False)
        elif self.use_overlay and flat and codes <= _OVERLAY_CODES and len(flat) < DIRECT_OPS:
            # (a group that writes nothing, failed transactions only, goes to LMDB below so that
            # LMDB's applied LSN, which snapshots read, covers it: the overlay keeps no LSN without a key)
            self._to_overlay(flat, last)
        else:
            self._write_through(flat, last, sum(map(payload_size, payloads)), puts_only=codes == _PUT_CODES)

    def _to_overlay(self, ops: Ops, last: int) -> None:
        """Apply puts and deletes ending at LSN ``last`` to the overlay."""
        full = self.overlay.add(ops, last)
        self.applied_lsn = last
        if full:
            self.flush()
        else:
            self.lmdb.maintain_now_and_then()

    def _apply_keyspaces(self, batches: Sequence[Ops], last: int, payloads: Sequence[Payload]) -> None:
        """Apply a group in which some batch uses a keyspace: its writes,
        each batch starting in the default keyspace, to LMDB now (the
        overlay holds the default keyspace only), in one write transaction
        after the overlay."""
        flat: list[Sequence[Any]] = []
        for ops in batches:
            flat.append(_TO_DEFAULT)
            flat.extend(conditions.writes_of(ops))
        self.applied_groups += 1
        self.applied_entries += len(batches)
        self._count(flat)
        self._write_through(flat, last, sum(map(payload_size, payloads)), puts_only=False)

    def flush(self) -> None:
        """Write the overlay to LMDB (one write transaction, one
        ``putmulti`` call) and record its highest LSN there as applied.
        Called when the overlay is full, by its thread, before reads of LMDB
        as a whole, and at close; any thread may call it."""
        overlay = self.overlay
        if not overlay.active and overlay.frozen is None:
            return  # (a flush in progress holds ``frozen``: wait for it below)
        if self._failure is not None:
            raise self._failure
        with overlay.flush_lock:
            if self.lmdb.closed:
                return
            frozen = overlay.freeze()
            if frozen is None:
                return
            values, lsn = frozen
            main = self.lmdb.main_db

            def write(txn: lmdb.Transaction) -> None:
                write_values(txn, values)
                if self.expiry.keys:
                    self.expiry.drop(txn, values)
                txn.put(K_APPLIED, _pack_u64(lsn), True, True, False, main)
            self._write_applied(write, lsn)
            overlay.thaw()
            self._reads_for_expiry()

    def _count(self, ops: Ops) -> None:
        for op in ops:
            code = op[0]
            if code in PUT_CODES:
                self.puts += 1
            elif code == OP_DELETE or code == OP_EXPIRE:
                self.deletes += 1
            elif code not in EXPIRY_CODES and code not in KEYSPACE_CODES:
                self.delete_ranges += 1

    def _write_through(self, ops: Ops, last: int, size_hint: int, *, puts_only: bool) -> None:
        """Apply ``ops`` (ending at LSN ``last``) to LMDB now, after what the
        overlay holds, in one write transaction; through the expiry metadata
        (:mod:`kvstore.state.expiry`) when they touch it or a key has an expiry."""
        expiry = self.expiry.keys > 0 or not {op[0] for op in ops}.isdisjoint(EXPIRY_CODES)
        overlay = self.overlay
        main = self.lmdb.main_db
        with overlay.flush_lock:
            frozen = overlay.freeze()
            self.lmdb.make_room(size_hint)

            def write(txn: lmdb.Transaction) -> None:
                if frozen is not None:
                    write_values(txn, frozen[0])
                    if self.expiry.keys:
                        self.expiry.drop(txn, frozen[0])
                if expiry:
                    self.expiry.apply(txn, ops, self.lmdb.keyspace_db_in)
                elif puts_only:
                    put_run(txn, ops)
                else:
                    apply_ops(txn, ops, self.lmdb.keyspace_db_in)
                txn.put(K_APPLIED, _pack_u64(last), True, True, False, main)
            self._write_applied(write, last)
            if frozen is not None:
                overlay.thaw()
            self.applied_lsn = last
            if expiry:
                self._reads_for_expiry()

    def _write_applied(self, write: Callable[[lmdb.Transaction], None], lsn: int) -> None:
        """Run ``write`` in one write transaction (growing the map as often
        as it fills) that makes LSNs up to ``lsn`` applied in LMDB. A failure
        is kept and raised again by every later apply and flush (the writes
        it carried are in the log: the next open replays them)."""
        t0 = time.perf_counter()
        try:
            self.lmdb.write(write)
        except BaseException as exc:
            if isinstance(exc, lmdb.Error):
                exc = LogFailedError(f"applying LSNs up to {lsn} to LMDB ({self.path}) failed: {exc}")
            if isinstance(exc, Exception):
                self._failure = exc
            raise exc from None
        self.lmdb_applied_lsn = lsn
        dt = time.perf_counter() - t0
        self.lmdb_commits += 1
        self.apply_seconds += dt
        if dt > self.apply_max_seconds:
            self.apply_max_seconds = dt
        self.lmdb.maintain_now_and_then()

    # -- reads of LMDB as a whole: the overlay flushed into it first ------------

    def view(self, max_seconds: float) -> View:
        """A consistent view of the state (:class:`kvstore.state.view.View`): of
        LMDB, once the overlay is flushed into it."""
        self.flush()
        return View(self.lmdb, max_seconds, alive=self._alive_check(DEFAULT_KEYSPACE))

    def view_in(self, keyspace: str, max_seconds: float) -> View:
        """:meth:`view` of the named ``keyspace``."""
        db = self.lmdb.keyspace_db(keyspace)
        return View(self.lmdb, max_seconds, db=ABSENT if db is None else db, alive=self._alive_check(keyspace))

    def read_view(self) -> ReadView:
        """The state at one LSN, from one read transaction: ``.lsn``,
        ``.count``, ``.pairs()`` (see :class:`kvstore.state.readers.ReadView`),
        the overlay flushed first, and each keyspace's pairs as snapshot
        sections (``.sections()``). Use as a context manager; it holds off
        map growth while open."""
        self.flush()
        while True:
            epoch, dbs = self._keyspace_dbs()
            view = ReadView(self.lmdb, {KEYSPACE_SECTION + name: db for name, db in dbs.items()})
            if self.lmdb.keyspace_epoch == epoch:
                return view  # every keyspace in its snapshot has its handle (opened before it began)
            view.close()  # a keyspace was created meanwhile: again

    def count(self) -> int:
        """The number of keys (expired ones not swept yet left out)."""
        self.flush()
        data = self.lmdb.data_db
        if not self._expiring():
            return self.lmdb.read(lambda txn: txn.stat(data)["entries"])
        now = self.now_us()
        return self.lmdb.read(lambda txn: txn.stat(data)["entries"]
                              - self.expiry.expired_keys(txn, now, DEFAULT_KEYSPACE))

    def scan(self, lo: bytes, hi: bytes | None, reverse: bool = False
             ) -> Generator[tuple[bytes, bytes], None, None]:
        """See :func:`kvstore.state.readers.scan` (which flushes the overlay
        before each snapshot it takes); expired keys left out."""
        pairs = scan(self.lmdb, self.flush, lo, hi, reverse)
        return self._alive_pairs(pairs) if self._expiring() else pairs

    # -- expiry (kvstore/state/expiry.py) ---------------------------------------

    def _expiring(self) -> bool:
        """Whether reads must check expiry: a key has one (a read-only open
        cannot tell, so it checks whenever the metadata exists)."""
        return self.expiry.keys > 0 or (self.readonly and self.expiry.present)

    def _reads_for_expiry(self) -> None:
        """Point :attr:`get` and :attr:`get_many` at the plain read path, or
        at the one that checks expiry while a key has one (under the
        overlay's lock, so that :meth:`_overlay_occupied`'s switch is never
        lost to this one)."""
        checking = self._expiring()
        if checking == self._checking:
            return
        with self.overlay.lock:
            self._checking = checking
            if checking:
                self.get, self.get_many = self._get_alive, self._get_many_alive
            else:
                self.get, self.get_many = self._plain_get, self._plain_get_many

    def _alive_check(self, keyspace: str) -> Callable[[lmdb.Transaction, bytes], bool] | None:
        """A view's check that a key of ``keyspace`` is not expired (None: no key has an expiry)."""
        if not self._expiring():
            return None
        alive, now_us = self.expiry.alive, self.now_us
        return lambda txn, key: alive(txn, keyspace, key, now_us())

    def _get_alive(self, key: object, default: bytes | None = None) -> bytes | None:
        """A get that finds a key expired at ``now_us()`` absent: the overlay
        first (a key written there has no expiry: writes with one go to LMDB,
        and the overlay's flush drops what LMDB held), then the key's value
        and its expiry from one LMDB read transaction."""
        if type(key) is not bytes:
            key = as_bytes(key, "key")
        overlay = self.overlay
        v = overlay.active.get(key, MISSING)
        if v is MISSING:
            frozen = overlay.frozen
            if frozen is not None:
                v = frozen.get(key, MISSING)
        if v is not MISSING:
            return default if v is None else v  # type: ignore[return-value]  # bytes or None (deleted)
        found = self._reads.run(partial(self.expiry.value_if_alive, self.lmdb.data_db, DEFAULT_KEYSPACE, key, self.now_us))
        return default if found is None else found

    def _get_many_alive(self, keys: Iterable[object], default: bytes | None = None) -> list[bytes | None]:
        return [self._get_alive(k, default) for k in keys]

    def _alive_pairs(self, pairs: Iterator[tuple[bytes, bytes]], keyspace: str = DEFAULT_KEYSPACE
                     ) -> Generator[tuple[bytes, bytes], None, None]:
        """``pairs`` of ``keyspace`` without the keys expired when each chunk of them is checked."""
        while True:
            chunk = list(islice(pairs, 256))
            if not chunk:
                return
            yield from self.lmdb.read(partial(self._alive_in, chunk, keyspace, self.now_us()))

    def _alive_in(self, pairs: list[tuple[bytes, bytes]], keyspace: str, now_us: int, txn: lmdb.Transaction
                  ) -> list[tuple[bytes, bytes]]:
        alive = self.expiry.alive
        return [kv for kv in pairs if alive(txn, keyspace, kv[0], now_us)]

    def read_expiry(self, fn: Callable[[lmdb.Transaction, Expiry], Any]) -> Any:
        """``fn(txn, expiry)`` in a fresh read transaction of LMDB (the
        overlay flushed first): what the store's TTL, lease and sweep
        questions read."""
        self.flush()
        return self.lmdb.read(lambda txn: fn(txn, self.expiry))

    # -- keyspaces (the default one is ``get``, ``scan``, ...) ---------------------

    def read(self, keyspace: str, key: bytes) -> bytes | None:
        """``key``'s value in ``keyspace`` ("": the default one), or None."""
        return self.get_in(keyspace, key)

    def get_in(self, keyspace: str, key: bytes, default: bytes | None = None) -> bytes | None:
        """``key``'s value in ``keyspace`` ("": the default one), or ``default``."""
        if not keyspace:
            return self.get(key, default)
        if type(key) is not bytes:
            key = as_bytes(key, "key")
        db = self.lmdb.keyspace_db(keyspace)
        if db is None:
            return default
        if self._expiring():  # a fresh transaction: a cached one may predate the handle
            found = self.lmdb.read(partial(self.expiry.value_if_alive, db, keyspace, key, self.now_us))
            return default if found is None else found
        return self._get_in(db, key, default)

    def get_many_in(self, keyspace: str, keys: Iterable[bytes], default: bytes | None = None
                    ) -> list[bytes | None]:
        """The values of ``keys`` in the named ``keyspace``, in order, from
        one read transaction (keyspaces never pass through the overlay)."""
        if not self._expiring():
            return read_in(self.lmdb, keyspace, keys, default)
        wanted = [k if type(k) is bytes else as_bytes(k, "key") for k in keys]
        db = self.lmdb.keyspace_db(keyspace)
        if db is None:
            return [default] * len(wanted)
        value_if_alive, now_us = self.expiry.value_if_alive, self.now_us

        def read(txn: lmdb.Transaction) -> list[bytes | None]:
            found = [value_if_alive(db, keyspace, k, now_us, txn) for k in wanted]
            return [default if v is None else v for v in found]
        return self.lmdb.read(read)

    def scan_in(self, keyspace: str, lo: bytes, hi: bytes | None, reverse: bool = False
                ) -> Generator[tuple[bytes, bytes], None, None]:
        """:meth:`scan` of the named ``keyspace`` (nothing when it does not exist)."""
        db = self.lmdb.keyspace_db(keyspace)
        if db is None:
            return _nothing()
        pairs = scan(self.lmdb, self.flush, lo, hi, reverse, db=db)
        return self._alive_pairs(pairs, keyspace) if self._expiring() else pairs

    def count_in(self, keyspace: str) -> int:
        """The number of keys in ``keyspace`` ("": the default one)."""
        if not keyspace:
            return self.count()
        db = self.lmdb.keyspace_db(keyspace)
        if db is None:
            return 0
        if not self._expiring():
            return self.lmdb.read(lambda txn: txn.stat(db)["entries"])
        now = self.now_us()
        return self.lmdb.read(lambda txn: txn.stat(db)["entries"] - self.expiry.expired_keys(txn, now, keyspace))

    def keyspaces(self) -> list[str]:
        """The named keyspaces that hold at least one key, sorted."""
        return sorted(self._keyspace_dbs()[1])

    def _keyspace_dbs(self) -> tuple[int, dict[str, Any]]:
        """``(epoch, {name: handle})`` of the keyspaces that hold a key, the
        handles opened before the read that counted them."""
        env = self.lmdb
        epoch = env.keyspace_epoch
        dbs = {name: env.keyspace_db(name) for name in env.read(env.keyspace_names)}
        return epoch, dict(env.read(lambda txn: [(n, db) for n, db in dbs.items()
                                                 if db is not None and txn.stat(db)["entries"]]))

    def read_meta_applied(self) -> int:
        """The applied LSN as LMDB holds it now (read-only opens: the
        writer's progress)."""
        return self.lmdb.read(self.lmdb.applied_in)

    def stats(self) -> dict[str, int | float | None]:
        """What was applied (counters, approximate under concurrent
        use) and how LMDB looks now
        (:meth:`kvstore.state.environment.Environment.stats`)."""
        if self._failure is None:
            self.flush()  # so that LMDB's counts include every applied write
        lmdb_stats = self.lmdb.stats()
        return {
            "puts": self.puts,
            "deletes": self.deletes,
            "delete_ranges": self.delete_ranges,
            "applied_entries": self.applied_entries,
            "applied_groups": self.applied_groups,
            "lmdb_commits": self.lmdb_commits,
            "apply_avg_us": self.apply_seconds / self.lmdb_commits * 1e6 if self.lmdb_commits else 0.0,
            "apply_max_us": self.apply_max_seconds * 1e6,
            "overlay_keys": len(self.overlay),
            "overlay_flushes": self.overlay.flushes,
            "expiring_keys": self.expiry.keys,
            "lmdb_applied_lsn": self.lmdb_applied_lsn,
            **lmdb_stats,
        }

    # -- lifecycle ----------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.lmdb.closed

    def close(self, *, sync: bool = True) -> None:
        """Write the overlay to LMDB, wait for readers to leave, flush LMDB to
        disk and close; with ``sync=False`` (the log failed) only close: the
        overlay's writes are in the log, the next open replays them. A failed
        write of the overlay is raised once LMDB is closed (not flushed)."""
        if self.lmdb.closed:
            return
        self.overlay.stop()
        error: Exception | None = None
        if sync and not self.readonly and self._failure is None:
            try:
                self.flush()
            except Exception as exc:  # raised below, once closed
                error = exc
        self.lmdb.close(sync=sync and error is None and not self.readonly)
        if error is not None:
            raise error
