"""What WAIT answers: how many replicas hold a write.

``WAIT numreplicas timeout`` waits until at least ``numreplicas`` of the
store's synchronous replicas (:mod:`kvstore.store.replication`: the
followers of a cluster's leader, each reporting its durable LSN) hold the
connection's last write, or ``timeout`` milliseconds (0: no limit), and
answers how many held it then, as Redis does. A write of a leader with
``--sync-replicas K`` is answered only once K replicas hold it, so ``WAIT K``
answers at once; a store without replicas answers 0 at once.
"""

from __future__ import annotations

import asyncio

from kvstore.store.store import KVStore

POLL_SECONDS = 0.002


def replicas_holding(store: KVStore, lsn: int) -> int:
    """How many replicas of ``store`` hold its LSN ``lsn`` durably now."""
    return store.replicas.holding(lsn) if store.replicas is not None and lsn else 0


async def wait_for_replicas(store: KVStore, lsn: int, wanted: int, timeout: float | None) -> int:
    """Until ``wanted`` replicas hold ``lsn``, at most ``timeout`` seconds
    (None: no limit, and only while a replica could answer); how many do."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while (held := replicas_holding(store, lsn)) < wanted and store.replicas is not None and not store.closed:
        if deadline is not None and loop.time() >= deadline:
            break
        await asyncio.sleep(POLL_SECONDS)
    return held
