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
none), and what it sees is :mod:`kvstore.store.readonly`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any, TypeVar

import snapshot
import wal
from kvstore.archive.target import Location
from kvstore.entry.codec import (
    DEFAULT_MAX_VALUE_BYTES,
    ENTRY_OVERHEAD,
    as_bytes,
    delete_entry,
    delete_range_entry,
    parse,
)
from kvstore.layout import WAL_DIR
from kvstore.state import DEFAULT_MAP_SIZE, Ops, StateOptions, View
from kvstore.state.lookups import MutableLookups
from kvstore.state.view import DEFAULT_MAX_VIEW_SECONDS, scan_bounds
from kvstore.store import groups, snapshots, txn
from kvstore.store.clock import Clock
from kvstore.store.expiring import DEFAULT_SWEEP_INTERVAL, Expiring, sweep_seconds
from kvstore.store.fast_path import GetPath, WritePath
from kvstore.store.following import Following
from kvstore.store.group_hooks import GroupHooks
from kvstore.store.keyspace import Keyspace, Keyspaces, keyspace_name, new_batch, new_transaction
from kvstore.store.leases import Lease
from kvstore.store.opening import checked_limits, refuse_writer_options, store_path
from kvstore.store.readonly import ReadOnly
from kvstore.store.replication import DEFAULT_SYNC_TIMEOUT, SyncReplicas
from kvstore.store.write_batch import WriteBatch
from kvstore.store.writer import ARCHIVE_CLOSE_TIMEOUT, StoreWriter
from kvstore.watch import consumers
from kvstore.watch import watcher as watching
from kvstore.watch.consumers import SubscriptionInfo
from kvstore.watch.subscription import Subscription, subscribe
from snapshot import SnapshotInfo
from wal.errors import ClosedError, ReadOnlyError, WalkvError
from wal.forkguard import forked_error, track
from wal.fs import OS_FS, FileSystem
from wal.progress import Progress
from wal.record import DEFAULT_MAX_RECORD_BYTES
from wal.timeline import History, TimelineStart

T = TypeVar("T")


class KVStore(MutableLookups):
    """An open store. Create with :func:`kvstore.open`.

    A store has a state machine (:class:`kvstore.state.State`), a hub that
    wakes its watchers, a writer (:class:`kvstore.store.writer.StoreWriter`:
    the lock, the log, the snapshots, the archiver; when ``readonly``, a
    :class:`kvstore.store.readonly.ReadOnly` in its place), its expiry
    (:class:`kvstore.store.expiring.Expiring`) and keyspaces
    (:class:`kvstore.store.keyspace.Keyspaces`); its methods delegate to
    them. A cluster's follower drives it through :attr:`following`
    (:class:`kvstore.store.following.Following`). Every write goes through one
    :class:`kvstore.store.fast_path.WritePath`, the one place that refuses
    writes.

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
        self.max_value_bytes = checked_limits(max_value_bytes, max_record_bytes, max_retained_bytes)
        waits = bool(sync_replicas or fence is not None)
        if self.readonly:
            refuse_writer_options(archive=archive, replicas=waits, log_options=log_options)
        self.replicas = SyncReplicas(sync_replicas, sync_timeout, fence=fence) if waits else None  # replication.py
        sweep_every = None if self.readonly else sweep_seconds(sweep_interval)  # the writer sweeps
        snapshots_ = snapshots.StoreSnapshots(self.path, self._fs, keep=keep_snapshots,
                                              chunk_bytes=snapshot_chunk_bytes)
        self._max_payload = max_record_bytes - ENTRY_OVERHEAD
        self._wal_dir = os.path.join(self.path, WAL_DIR)
        self._watch_hub = watching.WatchHub()  # wakes watchers, once per group commit
        hooks = GroupHooks(self._watch_hub)  # the log's (kvstore/store/group_hooks.py)
        self.max_record_bytes: int | None = None if self.readonly else max_record_bytes
        self.replayed = 0                      # log entries replayed (or rebuilt from) at open
        self.rebuilt: str | None = None        # why LMDB was rebuilt at open, if it was
        options = StateOptions(map_size, writemap, max_readers, overlay=bool(overlay))
        t0 = time.monotonic()
        self._writer: StoreWriter | ReadOnly  # the lock, log, snapshots, archiver; or the files' answers
        try:
            if self.readonly:
                self._writer, self._state = ReadOnly.open(self.path, options)
            else:
                self._writer, opened = StoreWriter.open(
                    self.path, self._fs, options, snapshots_, progress=progress, hooks=hooks,
                    log_options=dict(log_options, sync=sync, segment_bytes=segment_bytes,
                                     max_record_bytes=max_record_bytes))
                self._writer.max_retained_bytes = max_retained_bytes
                self._state, self.replayed, self.rebuilt = opened
                if snapshot_every_bytes:
                    self._writer.take_snapshots_every(self.snapshot, int(snapshot_every_bytes))
        except OSError as exc:
            raise WalkvError(f"cannot open the store {self.path}: {exc}") from exc
        self._log: wal.Log | None = self._writer.log  # None: read-only (another process writes)
        self._expiring = Expiring.wired(self._state, clock, self.max_value_bytes, self._max_payload,
                                        lambda payload, ops: self._writes.append(payload, ops), self.path)
        # Every write goes through _writes (kvstore/store/fast_path.py: what runs, and where it refuses).
        self._writes = WritePath(None if self._log is None else self._log.appender, self.max_value_bytes,
                                 self._expiring.put, self._write_refusal)
        self._keyspaces = Keyspaces(self._state, self.path, self._writes)
        self.following = Following(self._writer, self._state, self._expiring, self._check_open)
        """A cluster's follower's controls of this store (:mod:`kvstore.store.following`)."""
        # put and get bound to the compiled paths (docs/architecture.md, "The path of a put")
        if type(self).get is KVStore.get:
            self.get = GetPath(self._state).get  # type: ignore[method-assign]
        if type(self).put is KVStore.put:
            self.put = self._writes.put  # type: ignore[method-assign]
        if isinstance(self._writer, StoreWriter):
            hooks.bind(self._state, self._expiring, self._writer)
            if self.replicas is not None:
                self.replicas.epoch = self.history[-1].timeline
                hooks.replicas = self.replicas
        self._changes = watching.Source(self._wal_dir, snapshots.snapshots_dir(self.path), lambda: self.durable_lsn,
                                        self._watch_hub, polls=self._log is None)  # what watchers read
        if isinstance(self._writer, StoreWriter) and self.replicas is None:  # before any other write (store/groups.py)
            try:
                groups.abort_orphans(self._writes.append, self._state, self.path)
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
        if isinstance(self._writer, StoreWriter) and archive is not None:
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
        self._writes.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        if self._forked:
            raise forked_error(f"the store {self.path}", self._pid)

    # -- writes ------------------------------------------------------------------
    # Every write is one log entry (one LSN) appended through ``self._writes``
    # (kvstore/store/fast_path.py), the one way into the log and the one place a
    # write is refused. The operations travel with the payload through the log to
    # the state machine (docs/architecture.md, "The path of a put").

    def _write_refusal(self) -> WalkvError:
        """What a write raises once ``_writes`` has no log: closed, forked, read-only."""
        self._check_open()
        return ReadOnlyError(f"the store {self.path} was opened with readonly=True; writes are refused")

    def put(self, key: bytes, value: bytes, ttl: float | None = None, lease: Lease | int | None = None) -> int:
        """Set ``key`` to ``value``; return the write's LSN. Durable per the
        sync mode when it returns, and visible to every later read.

        ``ttl`` (seconds): the key expires that long from now; ``lease`` (from
        :meth:`grant`): the key lives as long as the lease
        (:class:`LeaseNotFoundError` when it is not alive, and nothing is
        set). A put without either drops the expiry the key had.
        See :mod:`kvstore.store.expiring`."""
        return self._writes.put(key, value, ttl, lease)

    def delete(self, key: bytes) -> int:
        """Remove ``key`` (absent keys too: the delete is logged anyway);
        return the LSN."""
        payload, ops = delete_entry(key)
        return self._writes.append(payload, ops)

    def delete_range(self, start: bytes | None, end: bytes | None) -> int:
        """Remove every key with ``start <= key < end`` (None: unbounded), as
        one atomic write; return its LSN."""
        payload, ops = delete_range_entry(start, end)
        return self._writes.append(payload, ops)

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
        return self._keyspaces.names()

    def drop_keyspace(self, name: str) -> int:
        """Remove every key of keyspace ``name`` as ONE log entry (one op,
        however many keys it holds); return its LSN. Durable and visible as
        any write. A keyspace that holds nothing is dropped too (logged)."""
        return self._keyspaces.drop(name)

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
        return groups.write_group(self._writes.append, self._state, lambda: self.last_lsn, parts, ops, app_id=app_id,
                                  app_version=app_version, writable_keyspace=self._keyspaces.writable)

    def committed_version(self, app_id: str) -> int | None:
        """The last ``app_version`` application ``app_id`` committed with
        :meth:`write_group` (None: none)."""
        self._check_open()
        return groups.committed_version(self._state, app_id)

    def compare_and_set(self, key: bytes, expected: bytes | None, new: bytes) -> bool:
        """Set ``key`` to ``new`` only if its value is ``expected`` (None: only
        if it is absent), decided in log order (:mod:`kvstore.store.txn`).
        True when it was set; either way the attempt is durable (one LSN)."""
        return txn.compare_and_set(self._writes.append, self.max_value_bytes, key, expected, new)

    def delete_if(self, key: bytes, expected: bytes) -> bool:
        """Delete ``key`` only if its value is ``expected``; True when deleted."""
        return txn.delete_if(self._writes.append, self.max_value_bytes, key, expected)

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
        return self._state.expiring_reads.count()

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
        return self._state.expiring_reads.scan(lo, hi, reverse)

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
        return self._state.expiring_reads.view(max_seconds)

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
        """The last LSN written to the log (read-only: the durable LSN)."""
        return self._writer.last_lsn

    @property
    def durable_lsn(self) -> int:
        """The last LSN known to be on disk."""
        return self._writer.durable_lsn

    @property
    def applied_lsn(self) -> int:
        """The last LSN applied: what this process's reads see (read-only:
        what the writer has written to LMDB)."""
        return self._writer.applied_lsn(self._state)

    def read_at(self, read: Callable[[], T]) -> tuple[T, int]:
        """``(read(), lsn)``: run ``read`` (a read of this store or of one of
        its keyspaces: ``lambda: db.get(k)``) and return its result with the
        applied LSN it read at, exactly: the result is the store's as of
        that LSN, no later write in it (it runs again when a group was
        applied meanwhile, so it may run more than once, and must only
        read; :mod:`kvstore.state.exact_reads`). What the
        server sends with a read (``Walkv-Lsn``). Not for a read that takes
        long (a scan): a :meth:`view` has its :attr:`~kvstore.state.view.View.lsn`."""
        self._check_open()
        return self._state.read_at(read)

    @property
    def history(self) -> History:
        """The log's timeline history, oldest first (:mod:`wal.timeline`;
        read-only: as its newest segment states it)."""
        return self._writer.history

    def start_timeline(self, number: int | None = None, *, timeline: TimelineStart | None = None) -> TimelineStart:
        """Go on on a new timeline from the next LSN (a promote or a failover:
        :mod:`wal.timeline`), numbered ``number`` (an election's epoch) or the
        next number, or ``timeline`` as given (a follower takes its leader's);
        return it. Synchronous replicas count reports of its number from here
        on. Durable on return."""
        self._check_open()
        start = self._writer.start_timeline(number, timeline)
        if self.replicas is not None:
            self.replicas.epoch = start.timeline
        return start

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failure(self) -> WalkvError | None:
        """The error the log failed with (it refuses every write until the
        store is reopened: a full disk, a failed fsync, replicas that did not
        confirm), or None."""
        return self._writer.failure

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
        return self._writer.snapshot(self._state, self._watch_hub.positions, keep=keep, chunk_bytes=chunk_bytes,
                                     progress=progress)

    def list_snapshots(self) -> list[SnapshotInfo]:
        """The store's valid snapshots, oldest first."""
        return snapshot.list_snapshots(snapshots.snapshots_dir(self.path))

    def wait_for_snapshots(self, timeout: float | None = None) -> None:
        """Wait for an automatic snapshot in progress (``snapshot_every_bytes``)."""
        self._writer.wait_for_snapshots(timeout)

    def sync(self) -> int:
        """Make every write so far durable (for ``sync="batch"``/``"none"``);
        return the durable LSN."""
        if self._log is None:
            self._check_open()
        return self._writer.sync()

    def flush_archive(self, timeout: float | None = 30.0) -> int:
        """Return the archived LSN once every write durable when called is in
        the archive (``archive=`` at open); :class:`ArchiveLagError` naming the
        lag and the last error after ``timeout`` seconds."""
        self._check_open()
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
        out.update(self._writer.stats())
        out["timeline"] = self.history[-1].timeline
        if self.replicas is not None:
            out["sync_replicas"] = self.replicas.stats(self.last_lsn)
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
        self._writes.close()  # a write from now on: "the store ... is closed", as a read says
        self._watch_hub.close()
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
