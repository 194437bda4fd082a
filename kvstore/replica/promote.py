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
   machine crash, its log starting where it does). The new log keeps the
   source's store id and goes on on a NEW timeline (:mod:`wal.timeline`)
   that forks from the replica's history after ``applied_lsn``: the same
   store, whose history changed course here, so the source's other replicas
   can follow the promoted store (a replica that applied LSNs past
   ``applied_lsn`` from the old source rebuilds, never mixes), and an
   archive of the source takes the new timeline beside the old one.
3. Remove ``REPLICA``: the commit point. Before it, the directory is still a
   replica (reopening it clears the half-made log and snapshot); after it,
   a store.

Do not restart the old source's writer after a promotion: it would go on
writing the old timeline after ``applied_lsn``; readers of both tell the two
histories apart and refuse to mix them, but two writers of one store is two
histories nobody can merge. The lock in step 1 only proves that no writer
was alive then.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Protocol

import wal
from kvstore.layout import LMDB_DIR, REPLICA_NAME, SNAPSHOTS_DIR, WAL_DIR
from kvstore.store import recovery
from kvstore.store.snapshots import write_view
from kvstore.store.store import KVStore
from wal.fs import OS_FS
from wal.timeline import History, fork_history, history_until, new_timeline


class Promotable(Protocol):
    """What promote needs of a :class:`kvstore.replica.replica.Replica`."""

    path: str
    source: Any
    history: History

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
            lineage = history_until(rep.history, applied)
            with wal.open(wal_dir, start_lsn=applied + 1, store_id=rep.source.store_id,
                          history=fork_history(lineage, new_timeline(rep.history, applied + 1))) as new_log:
                store_id, history = new_log.store_id, new_log.history
            with state.expiring_reads.read_view() as view:
                write_view(state, view, snaps, store_id=store_id)
            recovery.write_session(os.path.join(path, LMDB_DIR), store_id, clean=False, history=history)
            OS_FS.unlink(os.path.join(path, REPLICA_NAME))
            OS_FS.fsync_dir(path)
        finally:
            state.close(sync=True)
        recovery.write_session(os.path.join(path, LMDB_DIR), store_id, clean=True, history=history)
    finally:
        if fence is not None:
            fence.release()
    log.info("replica %s promoted at LSN %d: store %s goes on on %s (its source was %s)", path, applied, store_id,
             history[-1], rep.source.name)
    return KVStore(path, **options)
