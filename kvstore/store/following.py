"""Following another store's log: :class:`Following` (``db.following``).

A cluster's follower (:mod:`kvstore.cluster.follower`) is a whole store whose
log holds its leader's entries, with the leader's LSNs and commit times, and
none of its own writers'. Three controls make a store one, and only a
cluster node (:mod:`kvstore.cluster.node`) and the follower call them:

- :meth:`Following.refuse_writes`: while set, the store's own writes raise
  (a follower names its leader) and its sweeper stops, since the leader's
  sweeps arrive through its log;
- :meth:`Following.append_replicated`: the leader's entries, written,
  fsynced and applied as they are;
- :meth:`Following.discard_after`: the entries past the point where the
  leader's history left this store's (a deposed leader's unacknowledged
  writes) are dropped.

They change what the log holds from outside the store's own writes, so they
are not among :class:`kvstore.KVStore`'s operations; a new timeline, which a
promote and an election's winner begin too, is
(:meth:`kvstore.KVStore.start_timeline`). Each checks first that the store
is open (:class:`~wal.errors.ClosedError`); a read-only store refuses all
three (:class:`~wal.errors.ReadOnlyError`: its writer is another process).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import wal
from kvstore.state import State
from kvstore.store.expiring import Expiring
from kvstore.store.readonly import ReadOnly
from kvstore.store.writer import StoreWriter
from wal.errors import WalkvError
from wal.timeline import History


class Following:
    """The follower's controls of one open store (module docstring)."""

    def __init__(self, writer: StoreWriter | ReadOnly, state: State, expiring: Expiring,
                 check_open: Callable[[], None]) -> None:
        self._writer = writer
        self._state = state
        self._expiring = expiring
        self._check_open = check_open

    def refuse_writes(self, error: WalkvError | None) -> None:
        """While ``error`` is set every write raises it (a cluster's follower:
        :class:`~wal.errors.NotLeaderError` naming the leader), and expired
        keys are not swept (the leader's sweeps arrive through its log);
        None: writes are taken again. :meth:`append_replicated` goes on."""
        self._check_open()
        self._writer.refuse_appends(error)
        self._expiring.pause_sweeper(error is not None)

    def append_replicated(self, entries: Sequence[wal.Entry]) -> int:
        """Write and apply entries of another log of this store (its leader's),
        with their own LSNs and commit times; the first must be this store's
        next LSN. Durable and applied on return (:meth:`wal.Log.append_replicated`)."""
        self._check_open()
        return self._writer.append_replicated(entries)

    def discard_after(self, lsn: int, follow: History) -> int:
        """Drop the log's entries after ``lsn`` (what only this store holds past
        the point where ``follow``, its leader's history, left its own: a
        deposed leader's unacknowledged writes) and go on on ``follow``'s line;
        return how many were dropped. Snapshots past ``lsn`` are deleted. When
        the state had applied any of them (the store's ``applied_lsn`` is past
        ``lsn``), it is marked to be rebuilt: close the store and open it
        again before reading or following on. :class:`~wal.errors.SnapshotError`,
        with nothing changed, when no snapshot at or before ``lsn`` is left to
        rebuild it from (build the store again from its leader's snapshot)."""
        self._check_open()
        return self._writer.discard_after(lsn, follow, self._state)
