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
* the named database ``groups`` holds staged groups' parts until their
  commit, and applications' committed versions (:mod:`kvstore.state.groups`);
* walkv's bookkeeping (the store id, the applied LSN...) are plain keys of
  LMDB's main (unnamed) database: :mod:`kvstore.state.meta`.

Durability: the log's; LMDB is a cache of it, written by the commits of
:mod:`kvstore.state.commits` (which says why it can be trusted, and when).

Concurrency: one thread at a time applies (the log's committing thread, or the
opener while replaying); the overlay is written to LMDB by whichever thread
flushes it, one flush at a time; any number of threads read, each through its own
cached read transaction (a get is one LMDB lookup); see :mod:`kvstore.state.readers`
for how readers and the writer share LMDB without a lock on the read path.

:class:`State` owns applying (into the overlay, or through to LMDB), and
has the parts it delegates to: the environment (:mod:`kvstore.state.environment`), its bookkeeping
(:mod:`kvstore.state.meta`), the overlay, its LMDB commits
(:mod:`kvstore.state.commits`), a read path for gets
(:mod:`kvstore.state.reads`, whose :class:`~kvstore.state.reads.GetSelection`
picks the one its ``get`` is) and the reads that know expiry and keyspaces,
``state.expiring_reads`` (:mod:`kvstore.state.expiring_reads`: views, scans,
counts, keyspaces' reads, expiry metadata), which callers use directly.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, Final, NamedTuple, TypeVar

import lmdb

from kvstore.entry import conditions
from kvstore.entry.codec import (
    EXPIRY_CODES,
    GROUP_CODES,
    KEYSPACE_CODES,
    NO_WRITE_CODES,
    OP_DELETE,
    OP_EXPIRE,
    OP_KEYSPACE,
    OP_PUT,
    PUT_CODES,
    PlainPuts,
)
from kvstore.entry.limits import DEFAULT_KEYSPACE
from kvstore.state.base_load import load_sections
from kvstore.state.commits import LmdbCommits
from kvstore.state.environment import Environment
from kvstore.state.exact_reads import read_at_lsn
from kvstore.state.expiring_reads import ExpiringReads
from kvstore.state.expiry import Expiry
from kvstore.state.groups import Groups
from kvstore.state.meta import mark_complete, read_meta, write_meta
from kvstore.state.overlay import Overlay
from kvstore.state.reads import CachedReads, FreshReads, Get, GetMany, GetSelection
from kvstore.state.staged import StagedApply
from wal.errors import CorruptionError, Damage, WalkvError
from wal.forkguard import track
from wal.segment import Payload, payload_size

log = logging.getLogger("walkv.state")

DEFAULT_MAP_SIZE: Final = 8 << 20
"""The initial LMDB map of a new environment: small (the log's preallocation
step), since with ``writemap`` the whole map is given real blocks
(:mod:`kvstore.state.lmdb_env`); it grows as the data does
(:meth:`kvstore.state.environment.Environment.grow`). Not smaller: a grow
waits for open read views (a snapshot being written), so a small store
should rarely need one."""

T = TypeVar("T")
_first: Final = operator.itemgetter(0)
_PUT_CODES: Final = {OP_PUT}
_OVERLAY_CODES: Final = {OP_PUT, OP_DELETE}
_TO_DEFAULT = (OP_KEYSPACE, DEFAULT_KEYSPACE)

DIRECT_OPS: Final = 4096
"""A group of at least this many operations is written to LMDB at once (with
the overlay) rather than through the overlay: it is a bulk write already."""
Ops = Sequence[Sequence[Any]]
"""One log entry's operations, as :func:`kvstore.entry.codec.decode` returns them."""


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
        # applied, not yet in LMDB (kvstore/state/overlay.py); its first write and last flush switch gets
        self.overlay = Overlay(lambda occupied: self.gets.overlay_occupied(occupied))
        # counters (updated only by the applying thread)
        self.applied_groups = 0
        self.applied_entries = 0
        self.puts = 0
        self.deletes = 0
        self.delete_ranges = 0
        self._staging: StagedApply | None = None  # the group being staged (stage), while it runs
        # LMDB, shared by reading threads and the writer (kvstore/state/environment.py)
        self.lmdb = Environment(path, readonly=readonly, map_size=map_size, writemap=writemap,
                                max_readers=max_readers)
        track(self.overlay, owner=self.lmdb)  # a forked child's overlay holds nothing (it is compiled: no weakref)
        try:
            self._load_meta()
        except BaseException as exc:
            self.lmdb.close(sync=False)
            if isinstance(exc, lmdb.Error) and not isinstance(exc, WalkvError):
                raise CorruptionError(f"LMDB environment is unreadable: {exc}", kind=Damage.LMDB,
                                      path=path, offset=0) from None
            raise
        self.expiry = Expiry(self.lmdb.env, readonly=readonly)
        # the write transactions to LMDB, their failure and counters (kvstore/state/commits.py)
        self.commits = LmdbCommits(self.lmdb, self.overlay, self.expiry, self.applied_lsn,
                                   reads_changed=lambda: self.gets.expiry_changed(),
                                   publishing=self._publishing, written_through=self._written_through)
        # staged groups: parts until their commit, each group entry a transaction (kvstore/state/groups.py)
        self.groups = Groups(self.lmdb, self.expiry, self.commits, self.apply, self._count, readonly=readonly)
        # The read paths (kvstore/state/reads.py, chosen once) and the reads that know expiry and keyspaces
        # (kvstore/state/expiring_reads.py); state.get and get_many are GetSelection's choice of them.
        self._reads: CachedReads | FreshReads = (FreshReads(self.lmdb) if readonly
                                                 else CachedReads(self.lmdb, self.overlay))
        self.expiring_reads = ExpiringReads(self.lmdb, self.overlay, self.expiry, self._reads,
                                            self.commits.flush, readonly=readonly)
        self.get: Get
        self.get_many: GetMany
        reads = self.expiring_reads
        self.gets = GetSelection(self._reads, (reads.get, reads.get_many), reads.expiring, self.overlay.lock,
                                 self._serve)
        if self.use_overlay:
            self.overlay.start(self.commits.flush)

    def _serve(self, get: Get, get_many: GetMany) -> None:
        """What :attr:`get` and :attr:`get_many` are (:class:`~kvstore.state.reads.GetSelection`)."""
        self.get, self.get_many = get, get_many

    # -- meta ---------------------------------------------------------------

    def _load_meta(self) -> None:
        with self.lmdb.env.begin() as txn:
            meta = read_meta(txn, self.lmdb.main_db, self.path)
        self.initialized, self.store_id, self.applied_lsn, self.complete = meta
        self.applying_lsn = self.applied_lsn  # raised first while a group is applied (kvstore/state/exact_reads.py)

    def initialize(self, store_id: str, base_lsn: int = 0, *, complete: bool) -> None:
        """Write the meta of a fresh (or rebuilding) environment."""
        self.lmdb.write(partial(write_meta, self.lmdb.main_db, store_id, base_lsn, complete))
        self.store_id = store_id
        self.applied_lsn = self.applying_lsn = self.commits.applied_lsn = base_lsn
        self.complete = complete
        self.initialized = True

    def load_base(self, pairs: Iterator[tuple[bytes, bytes]], base_lsn: int,
                  chunk: int = 10000, *, sections: Mapping[str, Iterable[tuple[bytes, bytes]]] | None = None) -> int:
        """Bulk-load (key, value) pairs sorted by key and a snapshot's
        ``sections`` (:func:`kvstore.state.base_load.load_sections`), then mark
        the environment complete at ``base_lsn``. Returns the number of pairs
        loaded."""
        n = load_sections(self.lmdb, self.expiry, self.groups, pairs, sections or {}, chunk)
        self.gets.expiry_changed()
        self.lmdb.write(partial(mark_complete, self.lmdb.main_db, base_lsn, True))
        self.applied_lsn = self.applying_lsn = self.commits.applied_lsn = base_lsn
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
        failure = self.commits.failure  # (a commit that failed: raised by every later apply)
        if failure is not None:
            raise failure
        applied = self.applied_lsn
        last = first_lsn + len(batches) - 1
        if last <= applied:
            return
        if first_lsn <= applied:
            batches = batches[applied + 1 - first_lsn:]
        try:
            if len(batches) == 1 and self.use_overlay:
                ops = batches[0]
                op = ops[0] if len(ops) == 1 else None
                if type(op) is list:  # the common group: one op (a list, as logged: compiled, read in C)
                    code: int = op[0]  # (an int, as decoded or built: compared in C)
                    if code == OP_PUT or code == OP_DELETE:  # ... a put or a delete: into the overlay
                        self.applied_groups += 1
                        self.applied_entries += 1
                        self.applying_lsn = last
                        if code == OP_PUT:
                            self.puts += 1
                            full_or_due = self.overlay.set(op[1], op[2], last)
                        else:
                            self.deletes += 1
                            full_or_due = self.overlay.set(op[1], None, last)
                        self.applied_lsn = last
                        if full_or_due:
                            self.flush()
                        return
            flat = batches[0] if len(batches) == 1 else [op for ops in batches for op in ops]
            # (a batch of puts says so, kvstore.entry.codec.PlainPuts: 100,000 ops need no look)
            codes = _PUT_CODES if type(flat) is PlainPuts else set(map(_first, flat))
            if not codes.isdisjoint(GROUP_CODES):  # a staged group's part, commit or abort
                self.groups.apply(last - len(batches) + 1, batches)
                return
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
                self._write_through(flat, last, 0, puts_only=False, expiry_ops=True)
            elif (self.use_overlay and flat and codes <= _OVERLAY_CODES and len(flat) < DIRECT_OPS
                  and self._staging is None):
                # (a group that writes nothing, failed transactions only, goes to LMDB below so that
                # LMDB's applied LSN, which snapshots read, covers it: the overlay keeps no LSN without a key)
                self._to_overlay(flat, last)
            else:
                self._write_through(flat, last, sum(map(payload_size, payloads)), puts_only=codes == _PUT_CODES,
                                    expiry_ops=False)
        except BaseException:
            self.applying_lsn = self.applied_lsn  # (nothing past it was made visible: a failed commit aborted)
            raise

    def _to_overlay(self, ops: Ops, last: int) -> None:
        """Apply puts and deletes ending at LSN ``last`` to the overlay."""
        self.applying_lsn = last
        full_or_due = self.overlay.add(ops, last)
        self.applied_lsn = last
        if full_or_due:
            self.flush()  # (LMDB's maintenance follows each of its commits)

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
        self._write_through(flat, last, sum(map(payload_size, payloads)), puts_only=False,
                            expiry_ops=not {op[0] for op in flat}.isdisjoint(EXPIRY_CODES))

    def flush(self) -> None:
        """Write the overlay to LMDB: :meth:`LmdbCommits.flush
        <kvstore.state.commits.LmdbCommits.flush>`."""
        self.commits.flush()

    def _count(self, ops: Ops) -> None:
        for op in ops:
            code = op[0]
            if code in PUT_CODES:
                self.puts += 1
            elif code == OP_DELETE or code == OP_EXPIRE:
                self.deletes += 1
            elif code not in EXPIRY_CODES and code not in KEYSPACE_CODES:
                self.delete_ranges += 1

    def _write_through(self, ops: Ops, last: int, size_hint: int, *, puts_only: bool, expiry_ops: bool) -> None:
        """Apply ``ops`` (ending at LSN ``last``) to LMDB now, after what the
        overlay holds, in one write transaction
        (:meth:`kvstore.state.commits.LmdbCommits.write_through`); through the
        expiry metadata when they touch it (``expiry_ops``) or a key has an
        expiry. While a group is staged (:meth:`stage`), the transaction is
        left open for :class:`StagedApply` to commit."""
        staging = self._staging
        through = self.commits.write_through(ops, last, size_hint, puts_only=puts_only,
                                             expiry=expiry_ops or self.expiry.keys > 0, hold=staging is not None)
        if staging is not None:
            staging.through = through

    def _publishing(self, last: int) -> None:
        """In a write transaction about to commit writes up to LSN ``last``:
        a read that may see them waits for :attr:`applied_lsn` to reach it
        (:mod:`kvstore.state.exact_reads`)."""
        self.applying_lsn = last

    def _written_through(self, last: int, expiry: bool) -> None:
        """After a write-through transaction up to LSN ``last`` committed (the
        overlay's lock held): the LSN is applied."""
        self.applied_lsn = last
        if expiry:
            self.gets.expiry_changed()

    # -- staging a bulk group while the log writes and syncs it (the log's on_stage) -

    def stage(self, first_lsn: int, batches: Sequence[Ops], payloads: Sequence[Payload]) -> StagedApply | None:
        """What the log's ``on_stage`` returns for a group (:mod:`wal.log_writer`):
        for a group of at least :data:`DIRECT_OPS` operations, which is
        written to LMDB in one transaction anyway, a :class:`StagedApply` that
        writes it into an LMDB write transaction while the log writes and
        fsyncs it, and commits it once the fsync returned; None for any other group (a
        single put costs one length test here)."""
        if len(batches) == 1:
            if len(batches[0]) < DIRECT_OPS:
                return None
        elif sum(map(len, batches)) < DIRECT_OPS:
            return None
        if self.groups.any_in(batches):  # (applied in transactions of their own, after the fsync)
            return None
        return StagedApply(self, first_lsn, batches, payloads)

    # -- reads that know expiry and keyspaces: state.expiring_reads (kvstore/state/expiring_reads.py) ----

    def read(self, keyspace: str, key: bytes) -> bytes | None:
        """``key``'s value in ``keyspace`` ("": the default one), or None: what
        conditions are decided against (:func:`kvstore.entry.conditions.decide_group`)."""
        return self.expiring_reads.get_in(keyspace, key)

    def read_at(self, read: Callable[[], T]) -> tuple[T, int]:
        """``(read(), lsn)``: a read of this state and the applied LSN it
        read at, exactly (:func:`kvstore.state.exact_reads.read_at_lsn`; a
        read-only open compares the writer's applied LSN in LMDB before and
        after)."""
        if self.readonly:
            return read_at_lsn(read, self.read_meta_applied, self.read_meta_applied, self.path)
        return read_at_lsn(read, lambda: self.applied_lsn, lambda: self.applying_lsn, self.path)

    def read_meta_applied(self) -> int:
        """The applied LSN as LMDB holds it now (read-only opens: the
        writer's progress)."""
        return self.lmdb.read(self.lmdb.applied_in)

    def stats(self) -> dict[str, int | float | None]:
        """What was applied (counters, approximate under concurrent
        use) and how LMDB looks now
        (:meth:`kvstore.state.environment.Environment.stats`)."""
        commits = self.commits
        if commits.failure is None:
            self.flush()  # so that LMDB's counts include every applied write
        lmdb_stats = self.lmdb.stats()
        return {
            "puts": self.puts,
            "deletes": self.deletes,
            "delete_ranges": self.delete_ranges,
            "applied_entries": self.applied_entries,
            "applied_groups": self.applied_groups,
            "lmdb_commits": commits.count,
            "apply_avg_us": commits.seconds / commits.count * 1e6 if commits.count else 0.0,
            "apply_max_us": commits.max_seconds * 1e6,
            "overlay_keys": len(self.overlay),
            "overlay_flushes": self.overlay.flushes,
            "expiring_keys": self.expiry.keys,
            "lmdb_applied_lsn": commits.applied_lsn,
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
        if sync and not self.readonly and self.commits.failure is None:
            try:
                self.flush()
            except Exception as exc:  # raised below, once closed
                error = exc
        self.lmdb.close(sync=sync and error is None and not self.readonly)
        if error is not None:
            raise error
