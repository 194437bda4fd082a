"""walkv's key-value store: the database users open::

    import kvstore
    with kvstore.open(path) as db:          # sync="always": durable on return
        lsn = db.put(b"k", b"v"); db.get(b"k"); db.delete(b"k")
        with db.batch() as b:                # atomic: one LSN for all of it
            b.put(b"a", b"1"); b.delete(b"b"); b.delete_range(b"c", b"d")
        for key, value in db.scan(start=b"a", stop=b"z"): ...
        with db.view() as v:                 # several keys as of one LSN (v.lsn)
            v.get(b"a"), v.get(b"b")
        info = db.snapshot()                 # .lsn, .path; trims the log it covers
    kvstore.restore(path, target, to_lsn=None)   # point-in-time restore (to_time= too)

    db = kvstore.open(path, archive="s3://bucket/prefix?endpoint_override=...")  # or file://, a dir
    db.flush_archive(timeout=30); db.stats()["archive"]
    kvstore.restore("s3://bucket/prefix", target, to_time=datetime)           # from the archive
    rep = kvstore.open_replica(path, replica_dir) # follows the store; rep.get, rep.wait_for(lsn)

    async with kvstore.open_async(path) as adb:
        await adb.put(b"k", b"v")            # thousands of coroutines share each fsync

    db = kvstore.connect("http://127.0.0.1:7379", token=...)  # a `walkv serve` server, same API

See :mod:`kvstore.store.store` for durability and locking, :mod:`kvstore.entry.codec` for
the log entry format, :mod:`kvstore.state.machine` for the LMDB state machine and
:mod:`kvstore.store.recovery` for what open checks and rebuilds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# First: decides whether the compiled twins of the hot modules load (see wal.compiled).
from wal.compiled import build_info

# isort: split
from wal.errors import (
    ArchiveError,
    ArchiveFencedError,
    ArchiveLagError,
    ArchiveUnavailableError,
    ClosedError,
    CoordinatorError,
    CorruptionError,
    Damage,
    DiskFullError,
    FencedError,
    ForkedError,
    ForkedHistoryError,
    KeyspaceLimitError,
    LeaseNotFoundError,
    LockedError,
    LogFailedError,
    LogGapError,
    NotAStoreError,
    NotLeaderError,
    OutcomeUnknownError,
    ReadOnlyError,
    RecordTooLargeError,
    RecoveryNeededError,
    ReplicaError,
    ReplicaLagError,
    RestoreTimeError,
    SnapshotError,
    StoreVanishedError,
    SubscriptionForkedError,
    SubscriptionInvalidatedError,
    SyncReplicationError,
    ViewExpiredError,
    WalkvError,
)
from wal.lazy import lazy_names

if TYPE_CHECKING:
    from kvstore.archive import Archiver, ArchiveReader, ArchiveTarget
    from kvstore.client.wire import (
        ConditionFailed,
        Forbidden,
        NotSupportedRemotelyError,
        ServerUnavailable,
        Unauthorized,
    )
    from kvstore.entry.codec import MAX_KEY_BYTES
    from kvstore.replica.archive_restore import restore_from_archive
    from kvstore.replica.point_in_time import restore
    from kvstore.replica.restore import RestoreInfo
    from kvstore.state.view import View
    from kvstore.store.clock import Clock, ManualClock, SystemClock
    from kvstore.store.leases import KeepAlive, Lease
    from kvstore.store.metrics import prometheus_text
    from kvstore.store.store import KVStore, open
    from kvstore.store.write_batch import WriteBatch

_HOMES: dict[str, str] = {
    "Archiver": "kvstore.archive", "ArchiveReader": "kvstore.archive", "ArchiveTarget": "kvstore.archive",
    "ConditionFailed": "kvstore.client.wire", "Forbidden": "kvstore.client.wire",
    "NotSupportedRemotelyError": "kvstore.client.wire", "ServerUnavailable": "kvstore.client.wire",
    "Unauthorized": "kvstore.client.wire",
    "MAX_KEY_BYTES": "kvstore.entry.codec",
    "restore_from_archive": "kvstore.replica.archive_restore",
    "restore": "kvstore.replica.point_in_time",
    "RestoreInfo": "kvstore.replica.restore",
    "View": "kvstore.state.view",
    "Clock": "kvstore.store.clock", "ManualClock": "kvstore.store.clock", "SystemClock": "kvstore.store.clock",
    "KeepAlive": "kvstore.store.leases", "Lease": "kvstore.store.leases",
    "prometheus_text": "kvstore.store.metrics",
    "KVStore": "kvstore.store.store", "open": "kvstore.store.store",
    "WriteBatch": "kvstore.store.write_batch",
}
"""Where each of the face's names (but the errors and :func:`build_info`)
lives: imported on first use (:mod:`wal.lazy`), not by ``import kvstore``,
so a process that only reads files (a Spark worker running
:mod:`kvstore.spark`) never imports the store, LMDB or the archive. The
``TYPE_CHECKING`` imports above say the same for mypy and tests/test_layers.py."""


if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_names(globals(), _HOMES)


def open_replica(source, path, **options):
    """Open (or create) a read replica of ``source`` (a store directory, an
    archive location, or the ``http://``/``https://`` URL of ``walkv serve``
    with ``token=`` and ``verify=``) at ``path``. See
    :mod:`kvstore.replica.replica` and :mod:`kvstore.replica.http_source`."""
    from kvstore.replica.replica import open_replica as _open_replica

    return _open_replica(source, path, **options)


def connect(url: str, **options):
    """A client of a walkv server (``walkv serve``) with :class:`KVStore`'s
    API: ``kvstore.connect("https://host:7379", token=...)``. See
    :mod:`kvstore.client.remote` (needs the ``client`` extra: httpx)."""
    from kvstore.client.remote import connect as _connect

    return _connect(url, **options)


def serve(db, host: str = "127.0.0.1", port: int = 7379, **options) -> None:
    """Serve ``db`` (a store, its asyncio front or a path) over HTTP until
    SIGTERM: :func:`kvstore.server.serve` (needs the ``server`` extra)."""
    from kvstore.server import serve as _serve

    _serve(db, host, port, **options)


def connect_async(url: str, **options):
    """The asyncio client: ``async with kvstore.connect_async(url) as db:``
    or ``db = await kvstore.connect_async(url)``. See :mod:`kvstore.client.aremote`."""
    from kvstore.client.aremote import connect_async as _connect_async

    return _connect_async(url, **options)


def open_async(path, sync: str = "always", **options):
    """Open the store for asyncio: ``adb = await kvstore.open_async(path)`` or
    ``async with kvstore.open_async(path) as adb:``. See :mod:`kvstore.store.aio`."""
    from kvstore.store.aio import open_async as _open_async

    return _open_async(path, sync=sync, **options)


__all__ = [
    "MAX_KEY_BYTES", "build_info", "ArchiveError", "ArchiveReader", "ArchiveTarget", "Archiver", "ArchiveLagError",
    "ArchiveFencedError", "ArchiveUnavailableError", "ClosedError", "CoordinatorError", "CorruptionError", "Damage",
    "DiskFullError", "FencedError", "ForkedError", "ForkedHistoryError", "NotAStoreError", "NotLeaderError", "OutcomeUnknownError",
    "SyncReplicationError", "Clock", "KeepAlive", "KeyspaceLimitError", "Lease", "LeaseNotFoundError",
    "SubscriptionForkedError",
    "ManualClock", "SystemClock", "StoreVanishedError", "SubscriptionInvalidatedError", "KVStore", "LockedError",
    "LogFailedError", "LogGapError", "ReadOnlyError", "RecordTooLargeError", "RecoveryNeededError", "ReplicaError",
    "ReplicaLagError", "RestoreTimeError", "SnapshotError",
    "RestoreInfo", "View", "ViewExpiredError", "WalkvError", "WriteBatch", "connect", "connect_async", "open", "open_async",
    "open_replica", "serve",
    "prometheus_text", "restore", "restore_from_archive",
    "ConditionFailed", "Forbidden", "NotSupportedRemotelyError", "ServerUnavailable", "Unauthorized",
]
