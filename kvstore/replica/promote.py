"""Promoting a read replica to a writable store (``rep.promote()``).

When the source is gone, a replica can take over: it becomes a store like
any other, whose LSNs continue the source's.

1. Fence the source: a store source's lock is taken (held until the
   promotion is done), so a writer still alive, or one starting meanwhile,
   makes promote raise :class:`~wal.errors.LockedError` and nothing changes;
   an archive source must have no live archiver lease (its store is still
   shipping). Then everything the source has durable is applied.
2. Give the replica's directory its own log, empty and starting at
   ``applied_lsn + 1`` (as :mod:`kvstore.replica.restore` gives a restored store),
   and a snapshot at ``applied_lsn`` (so that it can rebuild its LMDB after a
   machine crash, its log starting where it does). The new log has a NEW
   store id: from here on its history is its own.
3. Remove ``REPLICA``: the commit point. Before it, the directory is still a
   replica (reopening it clears the half-made log and snapshot); after it,
   a store, and the LMDB meta is switched to the new store id (a crash before
   that makes the first open rebuild LMDB from the snapshot of step 2).

The old source's archive prefix: the promoted store is another store (its
own id), so an archiver refuses to ship it to the source's prefix (an archive
of another store); archive it to a new prefix. Do not restart the old
source's writer after a promotion: both would then write LSNs after
``applied_lsn``, two histories. The lock in step 1 only proves that no
writer was alive then.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Protocol

import snapshot
import wal
from kvstore.layout import LMDB_DIR, REPLICA_NAME, SNAPSHOTS_DIR, WAL_DIR
from kvstore.store import recovery
from kvstore.store.store import KVStore
from wal.fs import OS_FS


class Promotable(Protocol):
    """What promote needs of a :class:`kvstore.replica.replica.Replica`."""

    path: str
    source: Any

    def catch_up(self) -> int: ...

    def detach(self) -> Any: ...

log = logging.getLogger("walkv.replica")


def promote(rep: Promotable, options: dict[str, Any]) -> KVStore:
    """Promote ``rep`` (module docstring); ``options`` go to :func:`kvstore.open`."""
    fence = rep.source.fence()
    try:
        applied = rep.catch_up()
        state = rep.detach()
        rep.source.close()
        path = rep.path
        wal_dir = os.path.join(path, WAL_DIR)
        snaps = os.path.join(path, SNAPSHOTS_DIR)
        try:
            for leftover in (wal_dir, snaps):
                shutil.rmtree(leftover, ignore_errors=True)
            with wal.open(wal_dir, start_lsn=applied + 1) as new_log:
                store_id = new_log.store_id
            with state.read_view() as view:
                snapshot.write(snaps, view.lsn, view.pairs(), sections=view.sections(), store_id=store_id, total=view.count)
            OS_FS.unlink(os.path.join(path, REPLICA_NAME))
            OS_FS.fsync_dir(path)
            state.initialize(store_id, applied, complete=True)
        finally:
            state.close(sync=True)
        recovery.write_session(os.path.join(path, LMDB_DIR), store_id, clean=True)
    finally:
        if fence is not None:
            fence.release()
    log.info("replica %s promoted at LSN %d (new store id %s; its source was %s)", path, applied, store_id,
             rep.source.name)
    return KVStore(path, **options)
