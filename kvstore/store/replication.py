"""Synchronous replicas: a write acknowledged only once K replicas hold it
durably (``kvstore.open(path, sync_replicas=K, sync_timeout=S)``).

What a replica is here: a follower that copies this store's log into a log
of its own (:mod:`kvstore.cluster.follower`), fsyncs it, and asks for the
next entries from its durable LSN + 1. That request is its report: every
entry before it is durable on the replica (PostgreSQL's standby sends its
flush LSN the same way). :meth:`SyncReplicas.report` records it, for the
epoch (timeline number) the replica follows: a report of another epoch
counts for nothing, so a deposed leader's writes never complete on replicas
that follow its successor.

How a write waits: the log's leader thread writes and fsyncs a group, then
calls the store's ``commit`` hook (:mod:`kvstore.store.group_hooks`), which
waits here (:meth:`SyncReplicas.wait`) BEFORE the group is applied to the
state and before any of its writers returns. So one replication round trip
serves a whole group (group commit still groups: the writers that arrive
meanwhile form the next one), a read never sees a write no replica holds,
and with fewer than K replicas caught up a write waits ``sync_timeout``
seconds, then fails with :class:`~wal.errors.SyncReplicationError` (how many
held it): the entry is in this log, not acknowledged, and the log refuses
every later write until the store is reopened. Never a silent degrade to
fewer replicas. ``fence`` (a cluster's leader lease) is checked after the
replicas confirmed and before the write is acknowledged.

``on_durable`` is told each group's last LSN as the wait begins: the
server wakes its followers' long polls with it, so the round trip starts at
once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from wal.errors import SyncReplicationError

DEFAULT_SYNC_TIMEOUT = 10.0


@dataclass
class ReplicaPosition:
    """What one replica last reported."""

    name: str
    durable_lsn: int
    epoch: int
    seen: float  # time.monotonic() of the report


class SyncReplicas:
    """The replicas one store's writes wait for (module docstring)."""

    def __init__(self, required: int, timeout: float = DEFAULT_SYNC_TIMEOUT, *, epoch: int = 1,
                 fence: Callable[[int], None] | None = None) -> None:
        if type(required) is not int or required < 0:
            raise ValueError(f"sync_replicas must be an int >= 0, not {required!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"sync_timeout must be a number of seconds > 0, not {timeout!r}")
        self.required = required
        self.timeout = float(timeout)
        self.epoch = epoch
        self.fence = fence
        self.on_durable: Callable[[int], None] | None = None
        self.active = True
        """Whether writes wait (a cluster's replica copies its leader's log and waits for nobody)."""
        self._reported = threading.Condition()
        self._replicas: dict[str, ReplicaPosition] = {}
        self.waits = 0
        self.wait_seconds = 0.0

    def report(self, name: str, durable_lsn: int, epoch: int) -> None:
        """Replica ``name``, following epoch ``epoch``, holds every entry up to ``durable_lsn`` durably."""
        with self._reported:
            known = self._replicas.get(name)
            if known is None or known.epoch != epoch or durable_lsn >= known.durable_lsn:
                self._replicas[name] = ReplicaPosition(name, durable_lsn, epoch, time.monotonic())
            else:
                known.seen = time.monotonic()
            self._reported.notify_all()

    def holding(self, lsn: int) -> int:
        """How many replicas of this epoch hold ``lsn``."""
        return sum(1 for r in self._replicas.values() if r.epoch == self.epoch and r.durable_lsn >= lsn)

    def wait(self, lsn: int) -> None:
        """Block until ``required`` replicas hold ``lsn`` (then check the
        fence); :class:`SyncReplicationError` after ``timeout`` seconds."""
        if not self.active:
            return
        if self.on_durable is not None:
            self.on_durable(lsn)
        if self.required:
            t0 = time.monotonic()
            deadline = t0 + self.timeout
            with self._reported:
                while (held := self.holding(lsn)) < self.required:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise SyncReplicationError(
                            f"the write at LSN {lsn} is durable here and on {held} of the {self.required} "
                            f"replicas it needs ({self.timeout:g} s, sync_timeout); it was not acknowledged and "
                            f"its outcome is unknown (it stays if this store keeps leading). The store refuses "
                            f"further writes until it is reopened; bring replicas back, or reopen with fewer "
                            f"sync_replicas", lsn=lsn, holding=held, required=self.required)
                    self._reported.wait(left)
            self.waits += 1
            self.wait_seconds += time.monotonic() - t0
        if self.fence is not None:
            self.fence(lsn)

    def positions(self, last_lsn: int) -> list[dict[str, object]]:
        """Each replica's durable LSN, lag (LSNs behind ``last_lsn``) and the
        seconds since its last report, for ``stats()`` and ``/metrics``."""
        now = time.monotonic()
        with self._reported:
            return [{"name": r.name, "durable_lsn": r.durable_lsn, "epoch": r.epoch,
                     "lag_lsns": max(0, last_lsn - r.durable_lsn), "seen_seconds_ago": round(now - r.seen, 3)}
                    for r in sorted(self._replicas.values(), key=lambda r: r.name)]

    def stats(self, last_lsn: int) -> dict[str, object]:
        """The store's ``stats()["sync_replicas"]``: what writes wait for, how
        long they waited, and each replica (:meth:`positions`)."""
        return {"required": self.required, "timeout": self.timeout, "epoch": self.epoch, "waits": self.waits,
                "wait_seconds": self.wait_seconds, "replicas": self.positions(last_lsn)}

    def forget(self, name: str) -> None:
        with self._reported:
            self._replicas.pop(name, None)
