"""Building a node's store from its leader: the leader's newest snapshot, its
store id and its timeline history, and an empty log that goes on where the
snapshot is, on the leader's line (:func:`bootstrap`). The follower then
copies the leader's log from there (:mod:`kvstore.cluster.follower`).

It happens when a node joins with an empty directory, or when its store can
no longer follow (the leader's retention trimmed the LSNs it needs; its
history left the leader's before the leader's log begins). A directory that
held anything is never deleted: it is moved aside to
``<path>.replaced-<unix time>`` (its log may hold what a person wants to
read), and the node says so.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any

import snapshot
from kvstore.layout import SNAPSHOTS_DIR, WAL_DIR
from kvstore.replica.http_source import HttpSource
from kvstore.replica.restore import build
from wal.fs import OS_FS
from wal.reader import read_log
from wal.segment import list_segments

log = logging.getLogger("walkv.cluster")


def _never_written(path: str) -> bool:
    """A store a node made when it first started, never written: nothing to keep."""
    if not os.path.isdir(os.path.join(path, WAL_DIR)):
        return False
    segments = list_segments(os.path.join(path, WAL_DIR))
    return (len(segments) == 1 and segments[0].first_lsn == 1 and not any(read_log(os.path.join(path, WAL_DIR)))
            and not snapshot.list_snapshots(os.path.join(path, SNAPSHOTS_DIR)))


def bootstrap(path: str, leader: str, *, token: str | None = None, verify: Any = True) -> int:
    """Make ``path`` a copy of the leader at ``leader``'s newest snapshot
    (module docstring); return the LSN it holds up to."""
    src = HttpSource(leader, token=token, verify=verify)
    try:
        history = src.history()
        snap = src.base(src.durable_lsn())
        base_lsn = snap.lsn if snap is not None else 0
        if _never_written(path):
            shutil.rmtree(path)
        elif os.path.isdir(path) and os.listdir(path):
            aside = f"{path}.replaced-{int(time.time())}"
            os.rename(path, aside)
            OS_FS.fsync_dir(os.path.dirname(os.path.abspath(path)))
            log.warning("%s cannot follow %s as it is: moved aside to %s; building it from the leader's snapshot "
                        "at LSN %d", path, src.name, aside, base_lsn)
        build(path, src.log_source(base_lsn), snap, base_lsn, source=src.name, history=history,
              store_id=src.store_id)
        return base_lsn
    finally:
        src.close()
