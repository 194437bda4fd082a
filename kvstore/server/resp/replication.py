"""What WAIT answers: how many replicas hold a write.

``WAIT numreplicas timeout`` answers the number of replicas known to hold the
connection's last write durably. walkv's synchronous replicas are being
built (the HA issue); until then no replica acknowledges anything to the
writer, so this answers 0 at once, as a Redis with no replicas does. The one
function below is where the writer's replica acknowledgements (each
replica's durable LSN) plug in.
"""

from __future__ import annotations

from kvstore.store.store import KVStore


def replicas_holding(store: KVStore, lsn: int) -> int:
    """How many replicas of ``store`` hold its LSN ``lsn`` durably (0: none
    report to the writer yet)."""
    return 0
