"""walkv's key-value store: the database users open.

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

See :mod:`kvstore.store` for durability and locking, :mod:`kvstore.batch` for
the log entry format, :mod:`kvstore.state` for the LMDB state machine and
:mod:`kvstore.recovery` for what open checks and rebuilds.
"""

from __future__ import annotations

from kvstore.archiving import restore
from kvstore.batch import MAX_KEY_BYTES
from kvstore.restore import RestoreInfo
from kvstore.store import KVStore, open
from kvstore.view import View
from kvstore.write_batch import WriteBatch
from wal.errors import (
    ArchiveError,
    ArchiveLagError,
    ClosedError,
    CorruptionError,
    Damage,
    DiskFullError,
    ForkedError,
    LockedError,
    LogFailedError,
    LogGapError,
    ReadOnlyError,
    RecordTooLargeError,
    ReplicaError,
    ReplicaLagError,
    SnapshotError,
    StoreVanishedError,
    ViewExpiredError,
    WalkvError,
)


def open_replica(source, path, **options):
    """Open (or create) a read replica of ``source`` (a store directory or an
    archive location) at ``path``. See :mod:`kvstore.replica`."""
    from kvstore.replica import open_replica as _open_replica

    return _open_replica(source, path, **options)


def open_async(path, sync: str = "always", **options):
    """Open the store for asyncio: ``adb = await kvstore.open_async(path)`` or
    ``async with kvstore.open_async(path) as adb:``. See :mod:`kvstore.aio`."""
    from kvstore.aio import open_async as _open_async

    return _open_async(path, sync=sync, **options)


__all__ = [
    "MAX_KEY_BYTES", "ArchiveError", "ArchiveLagError", "ClosedError", "CorruptionError", "Damage",
    "DiskFullError", "ForkedError", "StoreVanishedError", "KVStore", "LockedError",
    "LogFailedError", "LogGapError", "ReadOnlyError", "RecordTooLargeError", "ReplicaError",
    "ReplicaLagError", "SnapshotError",
    "RestoreInfo", "View", "ViewExpiredError", "WalkvError", "WriteBatch", "open", "open_async", "open_replica",
    "restore",
]
