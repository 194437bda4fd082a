"""What builds on a store's files: read replicas and restores.

* :mod:`kvstore.replica.replica`: :class:`Replica`, following a store
  directory or an archive (:mod:`kvstore.replica.source`), promoted to a
  store by :mod:`kvstore.replica.promote`;
* :mod:`kvstore.replica.restore`: a new store from a store or snapshot
  directory at an LSN; :mod:`kvstore.replica.archive_restore`: from an
  archive; :mod:`kvstore.replica.point_in_time`: ``kvstore.restore``, any
  source, at an LSN or a time.
"""

from kvstore.replica.point_in_time import restore
from kvstore.replica.replica import Replica, open_replica
from kvstore.replica.restore import RestoreInfo

__all__ = ["Replica", "RestoreInfo", "open_replica", "restore"]
