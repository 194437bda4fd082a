"""A store's directory layout, named once::

    STORE/
      LOCK        fcntl lock held by the one writing process (holds its pid): wal.lock
      wal/        the log: wal (segments, sparse indexes, DURABLE)
      lmdb/       the state machine (kvstore.state.machine) and its SESSION record (kvstore.store.recovery)
      snapshots/  snap-<lsn 20 digits>/ directories: the snapshot package
      subscriptions/  named subscriptions and live consumers the log is kept for (kvstore.watch.consumers)
      ARCHIVED    the archived LSN a sidecar archiver publishes (kvstore.archive.marker)
      REPLICA     only in a read replica's directory (kvstore.replica.replica): which store it follows;
                  a writer refuses to open it until promote() removed it

:class:`StoreLayout` gives these paths for a store reached through any
read-only file seam (:mod:`wal.readfs`), so the store, restore, the command
line and the Spark source build them the same way.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from wal.lock import LOCK_NAME
from wal.readfs import ReadFS, resolve

WAL_DIR = "wal"
LMDB_DIR = "lmdb"
SNAPSHOTS_DIR = "snapshots"
SESSION_NAME = "SESSION"
ARCHIVED_NAME = "ARCHIVED"
REPLICA_NAME = "REPLICA"
SUBSCRIPTIONS_DIR = "subscriptions"
STORE_NAMES = frozenset((LOCK_NAME, WAL_DIR, LMDB_DIR, SNAPSHOTS_DIR, SUBSCRIPTIONS_DIR, ARCHIVED_NAME, REPLICA_NAME))
"""What walkv itself puts in a store's directory (a directory that holds anything
else and no ``wal/`` is not a store: :mod:`kvstore.store.opening`)."""


class StoreLayout(NamedTuple):
    """The paths of one store's parts, on the file system ``fs``."""

    fs: ReadFS
    root: str

    @classmethod
    def of(cls, location: str | os.PathLike[str] | tuple[Any, str]) -> StoreLayout:
        """The layout of a store given as a local path, a URI or a
        ``(filesystem, path)`` pair (see :func:`wal.readfs.resolve`)."""
        fs, root = resolve(location)
        return cls(fs, root)

    @property
    def wal_dir(self) -> str:
        return self.fs.join(self.root, WAL_DIR)

    @property
    def lmdb_dir(self) -> str:
        return self.fs.join(self.root, LMDB_DIR)

    @property
    def snapshots_dir(self) -> str:
        return self.fs.join(self.root, SNAPSHOTS_DIR)

    @property
    def archived_path(self) -> str:
        return self.fs.join(self.root, ARCHIVED_NAME)

    @property
    def lock_path(self) -> str:
        return self.fs.join(self.root, LOCK_NAME)

    def display(self, path: str | None = None) -> str:
        """``path`` (default: the store) as the user named it, for messages."""
        return self.fs.display(self.root if path is None else path)


__all__ = ["ARCHIVED_NAME", "LMDB_DIR", "REPLICA_NAME", "SESSION_NAME", "SNAPSHOTS_DIR", "STORE_NAMES", "SUBSCRIPTIONS_DIR",
           "StoreLayout",
           "WAL_DIR"]
