"""A replica's directory: claiming it, and the LMDB state it starts from.

The directory (``PATH``) is laid out like a store's (:mod:`kvstore.layout`):
``LOCK`` (one process follows a replica directory), ``lmdb/`` (with its
SESSION record, so a replica's LMDB is trusted or rebuilt after crashes
exactly like a store's, :mod:`kvstore.store.recovery`) and ``REPLICA``, a
JSON record ``{"format", "store_id", "source"}`` naming the source's store id
(written once, by a rename, then fsync of the directory; :func:`read_record`
reads it). LMDB records the same store id: a replica of another store is
refused (:class:`~wal.errors.ReplicaError`), and a writer refuses to open
the directory until the replica is promoted. A read-only store open
(``kvstore.open(PATH, readonly=True)``, ``walkv get/scan/stats PATH``) reads
the replica's LMDB beside the process following it, and writes nothing.

Starting: from the LMDB it has when that is trusted and the source's log
still reaches it; otherwise (the first open, a machine crash, the source's
retention trimmed past it, the source lost entries it had applied) it is
rebuilt from the source's newest snapshot that verifies plus the log after
it (:func:`kvstore.store.recovery.rebuild_state`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

from kvstore.layout import LMDB_DIR, REPLICA_NAME, SNAPSHOTS_DIR, WAL_DIR
from kvstore.replica.source import ReplicaSource
from kvstore.state import State, StateOptions
from kvstore.store import recovery
from wal.errors import ReplicaError
from wal.fs import OS_FS, file_in_the_way
from wal.timeline import History

log = logging.getLogger("walkv.replica")

REPLICA_FORMAT = 1
REBUILD_DIR = "lmdb.rebuild"
"""Where a rebuild while running builds the new LMDB (then renamed over ``lmdb/``)."""


def make(path: str) -> None:
    """Create the replica's directory (and its parents) unless it is there;
    :class:`~wal.errors.ReplicaError` when a file stands where it, or a
    directory above it, would be."""
    blocker = file_in_the_way(path)
    if blocker is not None:
        where = "it is a file" if blocker == os.path.abspath(path) else f"{blocker} is a file"
        raise ReplicaError(f"no replica can be at {path}: {where}, not a directory; a replica needs a directory "
                           "of its own (made if missing): give another path")
    OS_FS.makedirs(path)


def read_record(path: str) -> dict[str, Any] | None:
    """The ``REPLICA`` record of the directory ``path``: ``{"format",
    "store_id", "source"}`` (``source`` as the replica named it: a store's
    path, or an archive's URI with its credentials redacted); None when
    there is none (not a replica); :class:`~wal.errors.ReplicaError` when it
    is not one walkv wrote. Reads only."""
    marker = os.path.join(path, REPLICA_NAME)
    try:
        with open(marker, "rb") as f:
            rec: Any = json.loads(f.read(1 << 16))
    except FileNotFoundError:
        return None
    except ValueError:
        rec = None
    if not isinstance(rec, dict) or rec.get("format") != REPLICA_FORMAT:
        raise ReplicaError(f"{marker} is not a walkv replica record; move the directory aside")
    return rec


def claim(path: str, source: ReplicaSource) -> None:
    """Check (or write) ``REPLICA``; clear what an interrupted promote or
    rebuild left."""
    marker = os.path.join(path, REPLICA_NAME)
    sid = source.store_id
    rec = read_record(path)
    if rec is None:
        if os.path.exists(os.path.join(path, WAL_DIR)) or os.path.exists(os.path.join(path, LMDB_DIR)):
            raise ReplicaError(f"{path} is a store, not a replica (it has no {REPLICA_NAME} record); "
                               "a replica needs a directory of its own")
        data = json.dumps({"format": REPLICA_FORMAT, "store_id": sid, "source": source.name})
        OS_FS.write_file(marker + ".tmp", data.encode() + b"\n")
        OS_FS.rename(marker + ".tmp", marker)
        OS_FS.fsync_dir(path)
        return
    if rec.get("store_id") != sid:
        raise ReplicaError(f"{path} is a replica of store {rec.get('store_id')}, and {source.name} "
                           f"is store {sid}: a replica follows one store; use another directory")
    for leftover in (WAL_DIR, SNAPSHOTS_DIR, REBUILD_DIR):  # an interrupted promote or rebuild
        shutil.rmtree(os.path.join(path, leftover), ignore_errors=True)


def starting_state(path: str, source: ReplicaSource, options: StateOptions) -> tuple[State, History]:
    """The replica's LMDB state and the timeline history its entries are on:
    trusted as it is (its entries all on the source's history), or rebuilt
    (module docstring)."""
    lmdb_dir = os.path.join(path, LMDB_DIR)
    history = source.history()
    state, reason = recovery.trusted_state(lmdb_dir, source.store_id, source.first_lsn(), source.durable_lsn(),
                                           options, history=history)
    if state is not None:
        return state, history
    if os.path.exists(lmdb_dir):
        log.warning("rebuilding replica %s from %s: %s", path, source.name, reason)
    return rebuild(lmdb_dir, source, options)


def rebuild(lmdb_dir: str, source: ReplicaSource, options: StateOptions) -> tuple[State, History]:
    """A new LMDB at ``lmdb_dir``: the source's newest usable snapshot plus its
    log, and the history they are on (read before and after: a rebuild the
    source forked under is done again)."""
    while True:
        history = source.history()
        durable = source.durable_lsn()
        snap = source.base(durable)
        source.reset()
        state = recovery.rebuild_state(
            lmdb_dir, source.log_source(durable), store_id=source.store_id,
            base=snap, base_lsn=snap.lsn if snap is not None else 0,
            state_options=options, history=history)
        if source.history() == history:
            return state, history
        state.close(sync=False)
        log.warning("%s forked while a replica was rebuilt from it; rebuilding again", source.name)
