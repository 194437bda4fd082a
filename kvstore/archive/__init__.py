"""The archive: a store's log and snapshots off the machine (object storage,
``file://``, a local directory), checked, and restorable to an LSN or a time.

* :class:`~kvstore.archive.target.ArchiveTarget`: where an archive lives;
* :class:`~kvstore.archive.shipper.Archiver`: ships a store (in its process or as a sidecar);
* :class:`~kvstore.archive.reader.ArchiveReader`: its log, snapshots, times, verify;
* :func:`~kvstore.archive.restore.restore_from_archive`: a new store from it.

The layout and its rules: :mod:`kvstore.archive.layout`.
"""

from kvstore.archive.reader import ArchiveReader, Problem
from kvstore.archive.restore import restore_from_archive
from kvstore.archive.shipper import Archiver
from kvstore.archive.target import ArchiveTarget

__all__ = ["ArchiveReader", "ArchiveTarget", "Archiver", "Problem", "restore_from_archive"]
