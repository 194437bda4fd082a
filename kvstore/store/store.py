"""KVStore: the database users open. A write-ahead log plus an LMDB state machine.

The store's directory layout is :mod:`kvstore.layout`'s.

Durability, precisely. A write (put, delete, delete_range, a committed batch)
is one log entry with one LSN. It returns once the log acknowledged it, which
with ``sync="always"`` (default) means after an fsync that covers it; it was
also applied to the state machine before it returned, so the next read in any
thread of this process sees it. With ``sync="batch"`` or ``"none"`` it returns
once the entry reached the OS: safe against a crash of the process, not of the
machine (``sync()`` forces it to disk). LMDB's own writes are never fsynced on
the commit path; after a machine crash LMDB is rebuilt from the log
(kvstore/store/recovery.py).

Applied means: a group of fewer than 4,096 puts and deletes is applied to
the in-memory overlay (one dictionary operation per write), which reaches
LMDB in bulk within :data:`kvstore.state.overlay.FLUSH_SECONDS` (50 ms; 52 ms if
the writer went idle meanwhile), or sooner
when the overlay is full, before a scan, view, count or snapshot, and at
close (:mod:`kvstore.state.overlay`); any other group, and every group when the
store is opened with ``overlay=False``, is written to LMDB in its own write
transaction before the write returns.

Writers: one process at a time (``STORE/LOCK``, then the log's own lock); a
second one gets :class:`LockedError`. Any number of threads in the writing
process may read and write. ``readonly=True`` opens beside a writer (or
none): it reads LMDB through LMDB's reader lock table and never writes,
replays or takes the store lock. It sees what the writer has written to LMDB:
every write acknowledged at least 52 ms (plus the time of one bulk write of
at most 16,384 keys) before, so it may be up to that far behind the writer's
own reads; every write acknowledged by then when the writer opened the store
with ``overlay=False``; with no writer running it sees
the state as the last writer left it (after a crash of that writer, possibly
without its last group, which the next read-write open replays). It refuses
to open a store whose last writer was on a machine that crashed since. A
reader that was open while a writer rebuilt LMDB (after a machine crash)
keeps reading the environment it opened: reopen it to see the new one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from functools import partial
from typing import Any

import snapshot
import wal
from kvstore.archive.target import Location
from kvstore.entry.codec import (
    DEFAULT_MAX_VALUE_BYTES,
    ENTRY_OVERHEAD,
    MAX_KEY_BYTES,
    OP_DROP_KEYSPACE,
    as_bytes,
    check_keyspace,
    decode,
    delete_entry,
    delete_range_entry,
    pack_ops,
    parse,
    put_entry,
)
from kvstore.layout import LMDB_DIR, WAL_DIR
from kvstore.state import DEFAULT_MAP_SIZE, Ops, State, StateOptions, View
from kvstore.state.lookups import MutableLookups
from kvstore.state.view import DEFAULT_MAX_VIEW_SECONDS, scan_bounds
from kvstore.store import groups, recovery, snapshots, txn
from kvstore.store.clock import Clock, ExpiryClock, SystemClock
from kvstore.store.expiring import DEFAULT_SWEEP_INTERVAL, Expiring, sweep_seconds
from kvstore.store.fast_path import GetPath, PutPath
from kvstore.store.group_hooks import GroupHooks
from kvstore.store.keyspace import Keyspace, keyspace_name, new_batch, new_transaction, writable_keyspace
from kvstore.store.leases import Lease
from kvstore.store.opening import store_path
from kvstore.store.replication import DEFAULT_SYNC_TIMEOUT, SyncReplicas
from kvstore.store.write_batch import WriteBatch
from kvstore.store.writer import ARCHIVE_CLOSE_TIMEOUT, StoreWriter
from kvstore.watch import consumers
from kvstore.watch import watcher as watching
from kvstore.watch.consumers import SubscriptionInfo
from kvstore.watch.subscription import Subscription, subscribe
from snapshot import SnapshotInfo
from wal.errors import ArchiveError, ClosedError, ReadOnlyError, SnapshotError, WalkvError
from wal.forkguard import forked_error, track
from wal.fs import OS_FS, FileSystem
from wal.progress import Progress
from wal.record import DEFAULT_MAX_RECORD_BYTES
from wal.segment import Payload, read_newest_header
from wal.timeline import ROOT, History, TimelineStart


class KVStore(MutableLookups):
    """An open store. Create with :func:`kvstore.open`.

    A store has a state machine (:class:`kvstore.state.State`), a hub that
    wakes its watchers and, unless ``readonly``, a writer
    (:class:`kvstore.store.writer.StoreWriter`: the lock, the log, the
    snapshots, the archiver); its methods delegate to them. Every write goes
    through ``_append``, the one place that refuses writes.

    Thread-safe: any number of threads may read and write; concurrent writers
    share fsyncs (group commit). Use as a context manager, or call
    :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike[str], *, sync: str = "always",
                 segment_bytes: int = 64 << 20, readonly: bool = False,
                 map_size: int = DEFAULT_MAP_SIZE, writemap: bool = True,
                 max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 max_readers: int = 1024, overlay: bool = True,
                 keep_snapshots: int = snapshots.DEFAULT_KEEP,
                 snapshot_every_bytes: int | None = None,
                 snapshot_chunk_bytes: int | None = None,
                 progress: Progress | None = None, fs: FileSystem | None = None,
                 archive: Location | None = None, archive_interval: float = 1.0,
                 archive_keep_snapshots: int | None = None, archive_keep_seconds: float | None = None,
                 max_retained_bytes: int = consumers.DEFAULT_MAX_RETAINED_BYTES,
                 archive_close_timeout: float = ARCHIVE_CLOSE_TIMEOUT, clock: Clock | None = None,
                 sweep_interval: float | None = DEFAULT_SWEEP_INTERVAL, sync_replicas: int = 0,
                 sync_timeout: float = DEFAULT_SYNC_TIMEOUT, fence: Callable[[int], None] | None = None,
                 **log_options: Any) -> None:
        self.path = store_path(path)
        self.readonly = bool(readonly)
        self._fs = fs or OS_FS
        self._closed = True
        self._forked = False
        if max_record_bytes < 4096:
            raise ValueError(f"max_record_bytes must be at least 4096, not {max_record_bytes!r}")
        self.max_value_bytes = min(int(max_value_bytes), max_record_bytes - ENTRY_OVERHEAD - MAX_KEY_BYTES)
        if self.max_value_bytes < 1:
            raise ValueError(f"max_value_bytes must be positive, not {max_value_bytes!r}")
        if self.readonly and archive is not None:
            raise TypeError("a store opened with readonly=True does not archive; its writer does "
                            "(or run `walkv archive STORE URI` beside it)")
        if self.readonly and log_options:
            raise TypeError(f"readonly stores take no log options: {sorted(log_options)}")
        self.replicas: SyncReplicas | None = None  # what each write waits for (kvstore/store/replication.py)
        if sync_replicas or fence is not None:
            if self.readonly:
                raise TypeError("a store opened with readonly=True writes nothing; its writer waits for replicas")
            self.replicas = SyncReplicas(sync_replicas, sync_timeout, fence=fence)
        if type(max_retained_bytes) is not int or max_retained_bytes < 0:
            raise ValueError(f"max_retained_bytes must be an int >= 0, not {max_retained_bytes!r}")
        sweep_every = None if self.readonly else sweep_seconds(sweep_interval)  # the writer sweeps
        snapshots_ = snapshots.StoreSnapshots(self.path, self._fs, keep=keep_snapshots,
                                              chunk_bytes=snapshot_chunk_bytes)
        self._max_payload = max_record_bytes - ENTRY_OVERHEAD
        self._wal_dir = os.path.join(self.path, WAL_DIR)
        self._writer: StoreWriter | None = None  # None: read-only (another process writes)
        self._log: wal.Log | None = None          # the writer's log (for the write path)
        self._append: Callable[[Payload, Ops], int] = self._refuse_write  # (see "writes" below)
        self._watch_hub = watching.WatchHub()  # wakes watchers, once per group commit
        self._hooks = GroupHooks(self._watch_hub)  # the log's (kvstore/store/group_hooks.py)
        self.max_record_bytes: int | None = None if self.readonly else max_record_bytes
        self.replayed = 0                      # log entries replayed (or rebuilt from) at open
        self.rebuilt: str | None = None        # why LMDB was rebuilt at open, if it was
        options = StateOptions(map_size, writemap, max_readers, overlay=bool(overlay))
        t0 = time.monotonic()
        try:
            if self.readonly:
                self._state: State = recovery.open_readonly_state(self.path, os.path.join(self.path, LMDB_DIR),
                                                                  options)
            else:
                self._writer, opened = StoreWriter.open(
                    self.path, self._fs, options, snapshots_, progress=progress, hooks=self._hooks,
                    log_options=dict(log_options, sync=sync, segment_bytes=segment_bytes,
                                     max_record_bytes=max_record_bytes))
                self._log = self._writer.log
                self._append = self._log.appender.append
                self._writer.max_retained_bytes = max_retained_bytes
                self._state, self.replayed, self.rebuilt = opened
                if snapshot_every_bytes:
                    self._writer.take_snapshots_every(self.snapshot, int(snapshot_every_bytes))
        except OSError as exc:
            raise WalkvError(f"cannot open the store {self.path}: {exc}") from exc
        expiry_clock = ExpiryClock(clock or SystemClock())
        self._state.now_us = expiry_clock.now_us
        self._expiring = Expiring(self._state, expiry_clock, self.max_value_bytes, self._max_payload,
                                  lambda payload, ops: self._append(payload, ops), self.path)
        self._writable_keyspace: Callable[[str], str] = (  # checks a keyspace before a write into it
            check_keyspace if self._writer is None else partial(writable_keyspace, self._state, self.path))
        # put and get, compiled (kvstore/store/fast_path.py), unless a subclass overrides them
        if type(self).get is KVStore.get:
            self.get = GetPath(self._state).get  # type: ignore[method-assign]
        if self._log is not None and type(self).put is KVStore.put:
            self.put = PutPath(self._log.appender, self.max_value_bytes, self._expiring.put).put  # type: ignore[method-assign]
        self._hooks.bind(self._state, self._expiring, self._writer)
        if self.replicas is not None:
            self.replicas.epoch = self.history[-1].timeline
            self._hooks.replicas = self.replicas
        self._changes = watching.Source(self._wal_dir, snapshots.snapshots_dir(self.path), lambda: self.durable_lsn,
                                        self._watch_hub, polls=self._writer is None)  # what watchers read
        if self._writer is not None and self.replicas is None:  # before any other write (kvstore/store/groups.py)
            try:
                groups.abort_orphans(self._append, self._state, self.path)
            except BaseException:
                self._writer.close(self._state)
                raise
        if sweep_every is not None:
            self._expiring.start_sweeper(sweep_every)
        self.store_id: str | None = self._log.store_id if self._log is not None else self._state.store_id
        self.open_seconds = time.monotonic() - t0  # replay or rebuild included
        self._closed = False
        self._pid = os.getpid()
        track(self)
        if self._writer is not None and archive is not None:
            try:
                self._writer.start_archiver(archive, interval=archive_interval, keep_snapshots=archive_keep_snapshots,
                                            keep_seconds=archive_keep_seconds, close_timeout=archive_close_timeout)
            except BaseException:
                self.close()
                raise

    def _after_fork_in_child(self) -> None:
        """In a forked child (:mod:`wal.forkguard`): writes and reads raise
        ForkedError (its log and LMDB refuse too), close() does nothing."""
        if self._closed:
            return
        self._forked = True
        self._append = self._refuse_write
        vars(self).pop("put", None)  # the method, through _append

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        if self._forked:
            raise forked_error(f"the store {self.path}", self._pid)

    # -- writes ------------------------------------------------------------------
    # Every write is one log entry (one LSN) submitted through ``_append(payload, ops)``,
    # the one way into the log, and the one check that refuses a write: it is the log's
    # compiled appender (wal/append.py; a closed log raises ClosedError itself), or
    # _refuse_write when the store is read-only or forked. The operations travel with
    # the payload through the log to the state machine (docs/architecture.md, "The path
    # of a put"). A writable store's ``put`` is an instance attribute, the compiled
    # PutPath.put (kvstore/store/fast_path.py), which appends through the same appender; the
    # method below is what it does, and what runs read-only or forked (as ``get`` is GetPath.get).

    def _refuse_write(self, payload: Payload, ops: Ops) -> int:
        """``_append`` when the store may not write: read-only (no log) or forked."""
        self._check_open()
        raise ReadOnlyError(f"the store {self.path} was opened with readonly=True; writes are refused")

    def put(self, key: bytes, value: bytes, ttl: float | None = None, lease: Lease | int | None = None) -> int:
        """Set ``key`` to ``value``; return the write's LSN. Durable per the
        sync mode when it returns, and visible to every later read.

        ``ttl`` (seconds): the key expires that long from now; ``lease`` (from
        :meth:`grant`): the key lives as long as the lease
        (:class:`LeaseNotFoundError` when it is not alive, and nothing is
        set). A put without either drops the expiry the key had.
        See :mod:`kvstore.store.expiring`."""
        if ttl is None and lease is None:
            payload, ops = put_entry(key, value, self.max_value_bytes)
            return self._append(payload, ops)
        return self._expiring.put(key, value, ttl, lease)

    def delete(self, key: bytes) -> int:
        """Remove ``key`` (absent keys too: the delete is logged anyway);
        return the LSN."""
        payload, ops = delete_entry(key)
        return self._append(payload, ops)

    def delete_range(self, start: bytes | None, end: bytes | None) -> int:
        """Remove every key with ``start <= key < end`` (None: unbounded), as
        one atomic write; return its LSN."""
        payload, ops = delete_range_entry(start, end)
        return self._append(payload, ops)

    # -- keyspaces (kvstore/store/keyspace.py) -------------------------------------

    def keyspace(self, name: str) -> Keyspace:
        """The keyspace ``name`` (1..64 characters of ``[A-Za-z0-9_.-]``, not
        starting with ``__``): a handle with this store's API over its own
        keys, created by its first write (:mod:`kvstore.store.keyspace`).
        ``""`` is not a name: the default keyspace is the store itself."""
        return Keyspace(self, keyspace_name(name))

    def keyspaces(self) -> list[str]:
        """The named keyspaces that hold at least one key, sorted."""
        self._check_open()
        return self._state.keyspaces()

    def drop_keyspace(self, name: str) -> int:
        """Remove every key of keyspace ``name`` as ONE log entry (one op,
        however many keys it holds); return its LSN. Durable and visible as
        any write. A keyspace that holds nothing is dropped too (logged)."""
        ops = [[OP_DROP_KEYSPACE, check_keyspace(name, default_ok=False)]]
        return self._append(pack_ops(ops), ops)

    # -- more writes: del db[k], batches, conditional writes, raw entries ----------

    def batch(self) -> WriteBatch:
        """A batch of writes applied atomically as one log entry (one LSN)::

            with db.batch() as b:
                b.put(b"a", b"1"); b.delete(b"b"); b.delete_range(b"c", b"d")

        Committed when the ``with`` block ends normally (durable per the sync
        mode, then visible), discarded when it raises. ``b.lsn`` is the LSN.
        """
        return new_batch(self, "")

    def write(self, payload: bytes) -> int:
        """Append a pre-encoded batch payload (:mod:`kvstore.entry.codec`'s
        format) after validating it; return its LSN. For tools that copy
        batches. Not bytes-like: TypeError; not a valid batch: ValueError
        (nothing is written either way)."""
        payload = as_bytes(payload, "payload")
        return self._expiring.append_checked(payload, self._expiring.writable_ops(parse(payload)))

    def write_group(self, parts: Iterable[Ops | bytes], ops: Ops = (), *, app_id: str = "", app_version: int = 0
                    ) -> int | None:
        """Write ``parts`` (lists of writes, or encoded batches) and ``ops`` as ONE atomic write
        of any size, a staged group: the commit's LSN, or None when
        ``app_id`` committed ``app_version`` or a later one already. The
        caller must be the store's only writer meanwhile
        (:func:`kvstore.store.groups.write_group`)."""
        self._check_open()
        return groups.write_group(self._append, self._state, lambda: self.last_lsn, parts, ops, app_id=app_id,
                                  app_version=app_version, writable_keyspace=self._writable_keyspace)

    def committed_version(self, app_id: str) -> int | None:
        """The last ``app_version`` application ``app_id`` committed with
        :meth:`write_group` (None: none)."""
        self._check_open()
        return groups.committed_version(self._state, app_id)

    def compare_and_set(self, key: bytes, expected: bytes | None, new: bytes) -> bool:
        """Set ``key`` to ``new`` only if its value is ``expected`` (None: only
        if it is absent), decided in log order (:mod:`kvstore.store.txn`).
        True when it was set; either way the attempt is durable (one LSN)."""
        return txn.compare_and_set(self._append, self.max_value_bytes, key, expected, new)

    def delete_if(self, key: bytes, expected: bytes) -> bool:
        """Delete ``key`` only if its value is ``expected``; True when deleted."""
        return txn.delete_if(self._append, self.max_value_bytes, key, expected)

    def transaction(self) -> txn.Transaction:
        """Conditions plus writes, applied atomically only if every condition
        holds in log order (:class:`kvstore.store.txn.Transaction`)."""
        return new_transaction(self, "")

    # -- expiry: TTLs and leases (kvstore/store/expiring.py) -----------------------

    def ttl(self, key: bytes) -> float | None:
        """Seconds until ``key`` expires; None when it has no TTL or lease, or
        is absent (an expired key is absent)."""
        self._check_open()
        return self._expiring.ttl(key)

    def grant(self, ttl: float) -> Lease:
        """A new lease of ``ttl`` seconds (one durable entry): put keys with
        ``lease=``; :meth:`Lease.keepalive` extends it; :meth:`revoke` or its
        running out deletes its keys. See :mod:`kvstore.store.leases`."""
        return Lease(self, *self._expiring.grant(ttl))

    def lease(self, lease_id: int) -> Lease:
        """The lease ``lease_id`` granted before (by this or an earlier
        process); :class:`LeaseNotFoundError` when it is not alive."""
        self._check_open()
        return Lease(self, lease_id, self._expiring.granted_ttl_us(lease_id))

    def revoke(self, lease: Lease | int) -> int:
        """End ``lease`` and delete every key attached to it, in one entry
        that lists them (decided in log order); return its LSN.
        :class:`LeaseNotFoundError` when the lease does not exist."""
        return self._expiring.revoke(lease)

    def _keepalive(self, lease_id: int, ttl_us: int) -> float:
        return self._expiring.keepalive(lease_id, ttl_us)

    def _lease_ttl(self, lease_id: int) -> float | None:
        self._check_open()
        return self._expiring.lease_ttl(lease_id)

    def sweep_expired(self, max_keys: int | None = None) -> int:
        """Delete (by log entries) up to ``max_keys`` keys that are expired
        now, and end expired leases: what the sweeper thread does every
        ``sweep_interval``; for stores opened with ``sweep_interval=None``
        (a test's clock). Returns the number of keys deleted."""
        self._check_open()
        return self._expiring.sweep(max_keys)

    def _check_writable(self) -> None:
        """Before handing out a batch or transaction: refuse at once what
        :meth:`_append` would refuse at commit."""
        self._check_open()
        if self._log is None:
            self._append(b"", [])

    # -- reads -------------------------------------------------------------------
    # Served by the state machine; what a read sees is stated on each method and
    # in the module docstring.

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key``, or ``default``. Sees every write that returned
        before it was called (in any thread). After :meth:`close`:
        :class:`ClosedError`."""
        return self._state.get(key, default)

    def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        """The values of ``keys`` (``default`` for absent ones), in order,
        each as :meth:`get` would return it: the fast way to read many keys
        (one Python call per 1,024 keys, not one per key). Not one snapshot:
        for that, :meth:`view`."""
        self._check_open()
        return self._state.get_many(keys, default)

    def __len__(self) -> int:
        """The number of keys (LMDB keeps the count; O(1))."""
        self._check_open()
        return self._state.count()

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *,
             prefix: bytes | None = None, reverse: bool = False
             ) -> Generator[tuple[bytes, bytes], None, None]:
        """Yield ``(key, value)`` pairs in key order (descending when
        ``reverse``), with range() semantics: ``start <= key < stop``, and
        ``key.startswith(prefix)`` when a prefix is given (all three combine).

        Each key comes once, in order, with a value it had at some moment
        during the scan. A scan that takes under half a second is one LMDB
        snapshot taken at the first ``next()``; a longer one (or one that
        meets a growth of LMDB's map) goes on from a newer snapshot after the
        last key yielded, so that it never pins old pages for long (see
        :func:`kvstore.state.readers.scan`). For several keys as of one LSN use
        :meth:`view`. Close the iterator (or exhaust it) promptly: a paused
        one still holds its snapshot.
        """
        lo, hi = scan_bounds(start, stop, prefix)
        self._check_open()
        return self._state.scan(lo, hi, reverse)

    def view(self, max_seconds: float = DEFAULT_MAX_VIEW_SECONDS) -> View:
        """A consistent read of several keys: everything as of one LSN::

            with db.view() as v:
                v.get(b"a"), v[b"b"], b"c" in v, len(v), v.lsn
                for key, value in v.scan(prefix=b"user/"): ...

        One LMDB read transaction, safe beside writers and growth of the
        map; on read-only stores too. Bounded lifetime: an open view pins
        LMDB's pages and holds off growth of the map, so once older than
        ``max_seconds`` it is closed and raises
        :class:`~kvstore.ViewExpiredError`; a writer that must grow the map
        waits for younger views. After the ``with`` block: ClosedError. See
        :mod:`kvstore.state.view`."""
        self._check_open()
        return self._state.view(max_seconds)

    def watch(self, prefix: bytes | None = None, *, start: bytes | None = None, stop: bytes | None = None,
              from_lsn: int | None = None, timeout: float | None = None,
              progress_every: float | None = None, on_gap: str = "error",
              keyspace: str | None = "") -> watching.Watcher:
        """Follow the store's durable changes in log order, from ``from_lsn``
        (default: only new ones), for keys under ``prefix`` and in
        ``[start, stop)``, in ``keyspace`` ("": the default one; None: every
        keyspace, each change naming its own): an iterator (and context
        manager) of :class:`kvstore.watch.Change`. See :mod:`kvstore.watch.watcher`."""
        self._check_open()
        return watching.Watcher(self._changes, prefix, start=start, stop=stop, from_lsn=from_lsn,
                                timeout=timeout, progress_every=progress_every, on_gap=on_gap,
                                keyspace=keyspace)

    def subscribe(self, name: str, prefix: bytes | None = None, *, start: bytes | None = None,
                  stop: bytes | None = None, from_lsn: int | None = None, timeout: float | None = None,
                  progress_every: float | None = None) -> Subscription:
        """The named, durable subscription ``name``: changes as :meth:`watch`
        gives them, from after the last one acknowledged with ``sub.ack(lsn)``,
        across restarts of either side; the writer's log retention keeps them
        for it, up to ``max_retained_bytes``. Created at ``from_lsn`` (default:
        the next LSN) by the first call; the key range is fixed then. From a
        ``readonly=True`` process too. See :mod:`kvstore.watch.subscription`."""
        self._check_open()
        return subscribe(self.path, self._changes, name, prefix=prefix, start=start, stop=stop,
                         from_lsn=from_lsn, next_lsn=lambda: self.durable_lsn + 1, timeout=timeout,
                         progress_every=progress_every)

    def subscriptions(self) -> list[SubscriptionInfo]:
        """Every named subscription: its acknowledged LSN, its lag in LSNs
        and in log bytes kept for it, and why it was invalidated (or None)."""
        self._check_open()
        return consumers.infos(self.path, self.durable_lsn)

    def drop_subscription(self, name: str) -> bool:
        """Forget subscription ``name`` (the log it held is trimmed at the next
        snapshot); False when there was none."""
        self._check_open()
        return consumers.drop(self.path, name)

    # -- LSNs --------------------------------------------------------------------

    @property
    def last_lsn(self) -> int:
        """The last LSN written to the log."""
        if self._log is None:
            return wal.read_durable_lsn(self._wal_dir) or 0
        return self._log.last_lsn

    @property
    def durable_lsn(self) -> int:
        """The last LSN known to be on disk."""
        if self._log is None:
            return wal.read_durable_lsn(self._wal_dir) or 0
        return self._log.durable_lsn

    @property
    def applied_lsn(self) -> int:
        """The last LSN applied: what this process's reads see (read-only:
        what the writer has written to LMDB)."""
        if self.readonly and not self._closed:
            return self._state.read_meta_applied()
        return self._state.applied_lsn

    @property
    def history(self) -> History:
        """The log's timeline history, oldest first (:mod:`wal.timeline`;
        read-only: as its newest segment states it)."""
        if self._log is None:
            header = read_newest_header(self._wal_dir)
            return ROOT if header is None else header.history
        return self._log.history

    def start_timeline(self, number: int | None = None, *, timeline: TimelineStart | None = None) -> TimelineStart:
        """Go on on a new timeline from the next LSN (a promote or a failover:
        :mod:`wal.timeline`), numbered ``number`` (an election's epoch) or the
        next number, or ``timeline`` as given (a follower takes its leader's);
        return it. Synchronous replicas count reports of its number from here
        on. Durable on return."""
        self._check_open()
        if self._writer is None:
            raise ReadOnlyError(f"the store {self.path} was opened with readonly=True; its writer starts timelines")
        start = self._writer.start_timeline(number, timeline)
        if self.replicas is not None:
            self.replicas.epoch = start.timeline
        return start

    # -- following another store's log (kvstore/cluster/follower.py) ---------------

    def refuse_writes(self, error: WalkvError | None) -> None:
        """While ``error`` is set every write raises it (a cluster's follower:
        :class:`~wal.errors.NotLeaderError` naming the leader), and expired
        keys are not swept (the leader's sweeps arrive through its log);
        None: writes are taken again. :meth:`append_replicated` goes on."""
        self._check_open()
        if self._log is None:
            raise ReadOnlyError(f"the store {self.path} was opened with readonly=True")
        self._log.refuse_appends(error)
        self._expiring.pause_sweeper(error is not None)

    def append_replicated(self, entries: Sequence[wal.Entry]) -> int:
        """Write and apply entries of another log of this store (its leader's),
        with their own LSNs and commit times; the first must be this store's
        next LSN. Durable and applied on return (:meth:`wal.Log.append_replicated`)."""
        self._check_open()
        if self._log is None:
            raise ReadOnlyError(f"the store {self.path} was opened with readonly=True")
        return self._log.append_replicated(entries, [decode(e.payload, e.lsn) for e in entries])

    def discard_after(self, lsn: int, follow: History) -> int:
        """Drop the log's entries after ``lsn`` (what only this store holds past
        the point where ``follow``, its leader's history, left its own: a
        deposed leader's unacknowledged writes) and go on on ``follow``'s line;
        return how many were dropped. Snapshots past ``lsn`` are deleted. When
        the state had applied any of them (:attr:`applied_lsn` is past
        ``lsn``), it is marked to be rebuilt: close the store and open it
        again before reading or following on. :class:`~wal.errors.SnapshotError`,
        with nothing changed, when no snapshot at or before ``lsn`` is left to
        rebuild it from (build the store again from its leader's snapshot)."""
        self._check_open()
        if self._writer is None:
            raise ReadOnlyError(f"the store {self.path} was opened with readonly=True")
        return self._writer.discard_after(lsn, follow, self._state)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failure(self) -> WalkvError | None:
        """The error the log failed with (it refuses every write until the
        store is reopened: a full disk, a failed fsync, replicas that did not
        confirm), or None."""
        return self._log.failure if self._log is not None else None

    # -- snapshots, sync, archive, stats -----------------------------------------

    def snapshot(self, *, keep: int | None = None, progress: Progress | None = None,
                 chunk_bytes: int | None = None) -> SnapshotInfo:
        """Write a snapshot of the store at its applied LSN (``.lsn``,
        ``.path``), from one consistent LMDB view while writers go on; then
        keep the newest ``keep`` (default ``keep_snapshots``) snapshots and
        delete the log segments the oldest kept one covers. Durable on
        return; when nothing was written since the newest snapshot, that one
        is returned. ``chunk_bytes`` (default: the store's
        ``snapshot_chunk_bytes``) sizes the chunk files. See
        :mod:`kvstore.store.snapshots`."""
        self._check_open()
        if self._writer is None:
            raise SnapshotError(f"the store {self.path} is open read-only; snapshots are taken by its writer")
        return self._writer.snapshot(self._state, self._watch_hub.positions, keep=keep, chunk_bytes=chunk_bytes,
                                     progress=progress)

    def list_snapshots(self) -> list[SnapshotInfo]:
        """The store's valid snapshots, oldest first."""
        return snapshot.list_snapshots(snapshots.snapshots_dir(self.path))

    def wait_for_snapshots(self, timeout: float | None = None) -> None:
        """Wait for an automatic snapshot in progress (``snapshot_every_bytes``)."""
        if self._writer is not None:
            self._writer.wait_for_snapshots(timeout)

    def sync(self) -> int:
        """Make every write so far durable (for ``sync="batch"``/``"none"``);
        return the durable LSN."""
        if self._log is None:
            self._check_open()
            return self.durable_lsn
        return self._log.sync()

    def flush_archive(self, timeout: float | None = 30.0) -> int:
        """Return the archived LSN once every write durable when called is in
        the archive (``archive=`` at open); :class:`ArchiveLagError` naming the
        lag and the last error after ``timeout`` seconds."""
        self._check_open()
        if self._writer is None:
            raise ArchiveError(f"the store {self.path} is open read-only; its writer archives it")
        return self._writer.flush_archive(timeout)

    def stats(self) -> dict[str, Any]:
        """Counters and latencies of the open store: its LSNs, what open did,
        the state machine's counters (:meth:`kvstore.state.State.stats`) and
        the log's under ``"log"`` (:meth:`wal.Log.stats`), the archive's
        under ``"archive"`` (with ``archive=``; its URI redacted). Counters are
        approximate under concurrent use."""
        self._check_open()
        out: dict[str, Any] = {
            "path": self.path, "readonly": self.readonly,
            "last_lsn": self.last_lsn, "durable_lsn": self.durable_lsn, "applied_lsn": self.applied_lsn,
            "replayed_at_open": self.replayed, "rebuilt_at_open": self.rebuilt,
            "auto_snapshots": 0, "log_bytes_trimmed": 0, "open_seconds": self.open_seconds,
        }
        out.update(self._state.stats())
        out["expired_swept"] = self._expiring.swept
        if self._writer is not None:
            out.update(self._writer.stats())
        out["timeline"] = self.history[-1].timeline
        if self.replicas is not None:
            out["sync_replicas"] = {"required": self.replicas.required, "timeout": self.replicas.timeout,
                                    "epoch": self.replicas.epoch, "waits": self.replicas.waits,
                                    "wait_seconds": self.replicas.wait_seconds,
                                    "replicas": self.replicas.positions(self.last_lsn)}
        out["subscriptions"] = [s._asdict() for s in self.subscriptions()]
        return out

    # -- closing -----------------------------------------------------------------

    def close(self) -> None:
        """Finish every write in flight, flush LMDB, record a clean close and
        release the store (:mod:`kvstore.store.writer`). Idempotent. In a
        process forked from the one that opened the store it does nothing
        (see :mod:`wal.forkguard`)."""
        if self._closed or self._forked:
            return
        self.wait_for_snapshots()
        self._expiring.stop()
        self._closed = True
        # A write from now on: "the store ... is closed", as a read says (not the log's or LMDB's words).
        self._append, self._writable_keyspace = self._refuse_write, check_keyspace
        vars(self).pop("put", None)
        self._watch_hub.close()
        if self._writer is None:
            self._state.close(sync=False)
        else:
            self._writer.close(self._state)

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"<KVStore {self.path!r} closed>"
        mode = "readonly" if self.readonly else f"LSN {self.last_lsn}"
        return f"<KVStore {self.path!r} {mode}>"


def open(path: str | os.PathLike[str], sync: str = "always",  # noqa: A001
         segment_bytes: int = 64 << 20, readonly: bool = False, **options: object) -> KVStore:
    """Open (or create) the store at ``path``.

    Options: ``map_size`` (initial LMDB map, grown as needed), ``writemap``
    (default True), ``max_value_bytes``, ``max_record_bytes``, ``max_readers``,
    ``overlay`` (default True: small writes reach LMDB in bulk, up to 50 ms
    later, so ``readonly=True`` processes may lag that much; False: each
    group is written to LMDB before it returns), ``keep_snapshots``,
    ``snapshot_every_bytes`` (take a snapshot in the background whenever
    that much log was written since the last one), ``snapshot_chunk_bytes``,
    ``progress`` (callback(done, total) during replay), ``fs``, and the log's
    ``sync_interval``, ``sync_bytes``, ``recovery``.

    ``clock`` (an object with ``now_us()``, default the system clock) and
    ``sweep_interval`` (seconds, default 0.5; None: no sweeper thread, call
    ``sweep_expired()``): expiry's time and cleanup, see
    :mod:`kvstore.store.expiring`.

    ``sync_replicas`` (default 0) and ``sync_timeout`` (seconds, default 10):
    a write is acknowledged only once it is durable here and on that many
    replicas (followers of this store's log, :mod:`kvstore.cluster`), and
    fails with :class:`~wal.errors.SyncReplicationError` when they do not
    confirm it in time; ``fence(lsn)``, checked before each write is
    acknowledged, raises when this store may no longer acknowledge (a
    cluster's leader lease); see :mod:`kvstore.store.replication`.

    ``max_retained_bytes`` (default 1 GiB): the most log retention keeps for
    a consumer that falls behind (a named subscription past it is
    invalidated; :mod:`kvstore.watch.consumers`).

    ``archive``: ship the log and snapshots to an archive (a URI pyarrow
    understands, ``s3://...``, ``file://...``, a local directory, or a
    ``(filesystem, path)`` pair) every ``archive_interval`` seconds, in a
    thread of this process; ``archive_keep_snapshots``/``archive_keep_seconds``:
    the archive's retention; ``archive_close_timeout`` (default 5): the
    seconds ``close()`` gives its last round before it says (one warning)
    what was not shipped. See :mod:`kvstore.store.writer`.
    """
    return KVStore(path, sync=sync, segment_bytes=segment_bytes, readonly=readonly,
                   **options)  # type: ignore[arg-type]
