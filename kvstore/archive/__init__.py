"""The archive: a store's log and snapshots off the machine (object storage,
``file://``, a local directory), checked, and restorable to an LSN or a time.

* :class:`~kvstore.archive.target.ArchiveTarget`: where an archive lives;
* :class:`~kvstore.archive.shipper.Archiver`: ships a store (in its process or as a sidecar);
* :class:`~kvstore.archive.reader.ArchiveReader`: its log, snapshots, times, verify
  (a list of :class:`~wal.errors.DamageReport`);

The layout and its rules: :mod:`kvstore.archive.layout`. A new store from an
archive: ``kvstore.restore(URI, target)`` (:mod:`kvstore.replica.archive_restore`).
"""

from kvstore.archive.reader import ArchiveReader
from kvstore.archive.shipper import Archiver
from kvstore.archive.target import ArchiveTarget
from wal.errors import DamageReport

__all__ = ["ArchiveReader", "ArchiveTarget", "Archiver", "DamageReport"]
