"""The counters of an open store (:meth:`kvstore.KVStore.stats`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvstore.store import KVStore


def store_stats(db: KVStore) -> dict:
    """Counters and latencies of an open store: the log's (under ``"log"``)
    and the state machine's. Counters are approximate under concurrent use."""
    st = db._state
    groups = st.applied_groups
    out: dict = {
        "path": db.path,
        "readonly": db.readonly,
        "last_lsn": db.last_lsn,
        "durable_lsn": db.durable_lsn,
        "applied_lsn": db.applied_lsn,
        "puts": st.puts,
        "deletes": st.deletes,
        "delete_ranges": st.delete_ranges,
        "gets": st.gets,
        "applied_entries": st.applied_entries,
        "applied_groups": groups,
        "apply_avg_us": st.apply_seconds / groups * 1e6 if groups else 0.0,
        "apply_max_us": st.apply_max_seconds * 1e6,
        "map_grows": st.map_grows,
        "replayed_at_open": db.replayed,
        "rebuilt_at_open": db.rebuilt,
        "auto_snapshots": db._auto.taken if db._auto is not None else 0,
        "log_bytes_trimmed": db.log_bytes_trimmed,
        "open_seconds": db.open_seconds,
    }
    out.update(st.info())
    if db._log is not None:
        out["log"] = db._log.stats()
    return out
