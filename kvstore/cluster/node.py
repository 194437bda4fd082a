"""One node of a cluster (:class:`ClusterNode`): its store, its part in the
election (:mod:`kvstore.cluster.election`) and, while it follows, its
follower (:mod:`kvstore.cluster.follower`). ``walkv serve --cluster``
serves it over HTTP (:mod:`kvstore.server.cluster`).

Every node is started alike and is, at any moment, one of:

* a **replica**: its store refuses its own writers
  (:class:`~wal.errors.NotLeaderError`, naming the leader), its follower
  copies the leader's log into it, and it serves reads. It is one of the
  leader's synchronous replicas: its follower's requests are its reports.
* the **leader**: elected through etcd at epoch E, it begins timeline E at
  its next LSN, then takes writes; each is acknowledged once durable here
  and on ``sync_replicas`` replicas, and only while its lease holds (the
  fence, checked after the replicas confirmed).

Changes of role:

* replica -> leader (it won the election): the follower is stopped (its
  last append done), the store begins timeline E, etcd records that this
  node holds timeline E (:meth:`~kvstore.cluster.election.Elector.hold`),
  writes are taken. A replica's follower records each new timeline the
  same way before it reports it.
* leader -> replica (its lease ran out, or a write failed waiting for its
  replicas or its fence: the log refuses every later write): the node lets
  the leader key go, and its store is closed and opened again
  (:attr:`ClusterNode.reopen` is set; the serving loop does it), so that
  it starts over as a replica from what its log holds. What it wrote past
  the new leader's fork is discarded then (never served: its state is
  rebuilt when it had applied any of it).
* a replica whose follower cannot go on (it must drop entries its state
  applied: "reopen"; it needs the leader's snapshot: "bootstrap") is
  reopened the same way, bootstrapped first when asked. A leader that
  stops answering during that copy does not end the node: it opens the
  store it has (or a new, empty one, when the copy had moved the old one
  aside) and follows whoever leads, whose follower asks for a copy again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import kvstore.store.store as store_module
from kvstore.cluster.bootstrap import bootstrap
from kvstore.cluster.election import Elector, Leader, Position
from kvstore.cluster.etcd import Etcd
from kvstore.cluster.follower import Follower
from kvstore.store.replication import DEFAULT_SYNC_TIMEOUT
from kvstore.store.store import KVStore
from wal.errors import FencedError, NotLeaderError, ReplicaError, WalkvError
from wal.timeline import timeline_at

log = logging.getLogger("walkv.cluster")

DEFAULT_LEASE_SECONDS = 5.0
HOLD_TIMEOUT = 10.0
"""Seconds a follower waits for etcd to record the timeline it is about to report (:meth:`ClusterNode._hold`)."""


class ClusterNode:
    """One node (module docstring). ``advertise`` is the URL the other nodes
    and clients reach it at; ``token`` the read token it follows the leader
    with (when the servers have tokens)."""

    def __init__(self, path: str, *, cluster: str, coordinator: str, advertise: str, sync_replicas: int = 0,
                 sync_timeout: float = DEFAULT_SYNC_TIMEOUT, lease_seconds: float = DEFAULT_LEASE_SECONDS,
                 token: str | None = None, verify: Any = True, store_options: dict[str, Any] | None = None) -> None:
        self.path = os.path.abspath(path)
        self.cluster = cluster
        self.me = advertise.rstrip("/")
        self.sync_replicas = sync_replicas
        self.sync_timeout = sync_timeout
        self.token = token
        self.verify = verify
        self.store_options = dict(store_options or {})
        self.etcd = Etcd(coordinator)
        self.elector = Elector(self.etcd, cluster, self.me, lease_seconds=lease_seconds, sync_replicas=sync_replicas,
                               position=self.position, frozen=self.frozen, on_change=self._leader_changed)
        self.store: KVStore | None = None
        self.follower: Follower | None = None
        self.role = "replica"
        self.reopen = asyncio.Event()
        self._needs: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._elector_task: asyncio.Task[None] | None = None
        self._monitor_task: asyncio.Task[None] | None = None
        self.discarded = 0

    # -- the store's life -----------------------------------------------------------------

    async def open(self) -> KVStore:
        """Open the store as a replica (bootstrapping it first when its
        follower asked for it) and start following whoever leads."""
        self._loop = asyncio.get_running_loop()
        needs, self._needs = self._needs, None
        leader = self.elector.leader
        self.store = await asyncio.to_thread(self._open_store, needs, leader)
        self.follower = Follower(self.store, self.me, token=self.token, verify=self.verify,
                                 on_stop=self._follower_stopped, before_report=self._hold)
        self.reopen.clear()
        self.role = "replica"
        leader = self.elector.leader  # now: it may have changed while the store opened (no one was told then)
        if leader is not None and leader.url == self.me:
            # it led until this reopen (its fence refused a write, its log failed) and the key is still its
            # own: let it go, so that an election follows (it may win again, on a new timeline)
            await self.elector.resign()
        elif leader is not None:
            self.follower.follow(leader.url, leader.epoch)
        if self._elector_task is None:
            self._elector_task = asyncio.create_task(self.elector.run(), name="walkv-elector")
            self._monitor_task = asyncio.create_task(self._monitor(), name="walkv-node-monitor")
        return self.store

    async def _monitor(self) -> None:
        """A failed log (a write its replicas or its lease did not confirm):
        step down and start over (module docstring)."""
        while True:
            await asyncio.sleep(0.05)
            store = self.store
            if store is not None and not store.closed and store.failure is not None and not self.reopen.is_set():
                log.warning("cluster %s: %s: its log failed (%s); it starts over as a replica", self.cluster,
                            self.me, store.failure)
                if self.role == "leader":
                    self.role = "replica"
                    await self.elector.resign()
                self.reopen.set()

    def _open_store(self, needs: str | None, leader: Leader | None) -> KVStore:
        if needs is not None and needs.startswith("bootstrap") and leader is not None:
            try:
                bootstrap(self.path, leader.url, token=self.token, verify=self.verify)
            except (WalkvError, OSError) as exc:  # the leader stopped answering: the node goes on, and asks again
                log.warning("cluster %s: %s could not build its store from %s (%s); it opens the store it has and "
                            "follows whoever leads, which asks for a copy again if it still needs one",
                            self.cluster, self.me, leader.url, exc)
        store = store_module.open(self.path, sync_replicas=self.sync_replicas, sync_timeout=self.sync_timeout,
                                  fence=self._fence, sweep_interval=None, **self.store_options)
        assert store.replicas is not None
        store.replicas.active = False  # a replica waits for nobody; the leader's writes wait (_lead)
        store.following.refuse_writes(self._not_leader())
        return store

    async def close_store(self) -> None:
        """Stop following and close the store (before a reopen, or at the end)."""
        follower, store = self.follower, self.store
        self.follower = self.store = None
        await asyncio.to_thread(_close, follower, store)

    async def close(self) -> None:
        await self.elector.stop()
        for task in (self._elector_task, self._monitor_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.close_store()
        await self.etcd.close()

    # -- what the election asks ---------------------------------------------------------

    def position(self) -> Position:
        store = self.store
        if store is None or store.closed:
            return Position(0, 0)
        last = store.durable_lsn
        history = store.history
        return Position(timeline_at(history, last).timeline if last else 0, last, max(s.timeline for s in history))

    def frozen(self) -> bool:
        follower = self.follower
        return self.store is not None and (follower is None or follower.idle) and self.role != "leader"

    async def _leader_changed(self, leader: Leader | None) -> None:
        store = self.store
        if store is None:
            return
        if self.role == "leader" and (leader is None or leader.url != self.me):
            log.warning("cluster %s: %s steps down (%s)", self.cluster, self.me,
                        "no leader" if leader is None else f"{leader.url} leads epoch {leader.epoch}")
            self.role = "replica"
            store.following.refuse_writes(self._not_leader())
            await self.elector.resign()
            self.reopen.set()
            return
        if leader is not None and leader.url == self.me:
            await self._lead(leader.epoch)
            return
        store.following.refuse_writes(self._not_leader())
        if self.follower is not None:
            self.follower.follow(None if leader is None else leader.url, 0 if leader is None else leader.epoch)

    async def _lead(self, epoch: int) -> None:
        store, follower = self.store, self.follower
        assert store is not None
        t0 = time.monotonic()

        def take_over() -> None:
            if follower is not None:
                follower.stop()
            store.start_timeline(epoch)

        try:
            await asyncio.to_thread(take_over)
            await self.elector.hold(epoch)  # before its epoch's first write (election.py: a disk that goes back)
            assert store.replicas is not None
            store.replicas.active = True
            store.following.refuse_writes(None)
        except Exception as exc:  # noqa: BLE001 - it cannot lead: let the key go, start over
            log.error("cluster %s: %s won epoch %d but cannot lead: %s", self.cluster, self.me, epoch, exc)
            await self.elector.resign()
            self.reopen.set()
            return
        self.follower = None
        self.role = "leader"
        log.warning("cluster %s: %s leads epoch %d from LSN %d (%.0f ms to take over)", self.cluster, self.me,
                    epoch, store.last_lsn + 1, (time.monotonic() - t0) * 1000)

    def _hold(self, timeline: int) -> None:
        """Before the follower reports a position on ``timeline``: etcd records
        that this node held it (:meth:`Elector.hold`), waited for in the
        follower's thread."""
        if timeline <= self.elector.held:
            return
        assert self._loop is not None  # set by open(), before any follower
        asyncio.run_coroutine_threadsafe(self.elector.hold(timeline), self._loop).result(HOLD_TIMEOUT)

    def _fence(self, lsn: int) -> None:
        """Before a write is acknowledged (kvstore.store.replication): only
        while this node leads and its lease holds by its own clock."""
        if self.role != "leader" or not self.elector.lease_ok():
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self.reopen.set)
            raise FencedError(f"{self.me} is no longer the leader of cluster {self.cluster} (its lease ran out, or "
                              f"another node leads): the write at LSN {lsn} is in its log but was not "
                              f"acknowledged; its outcome is unknown. This node steps down and follows the new "
                              f"leader")

    def check_read(self) -> None:
        """A leader whose lease ran out answers no read (it may be deposed).
        A replica answers reads once its follower has checked its history
        against the leader it follows (:attr:`Follower.on_leaders_line
        <kvstore.cluster.follower.Follower.on_leaders_line>`): a node opened
        again after it led may hold entries it wrote and applied that no
        replica confirmed, which the leader's history does not have and
        which it discards then. Before that (and while no one leads) a read is
        :class:`~wal.errors.ReplicaError` (503): read from another node."""
        if self.role == "leader":
            if not self.elector.lease_ok():
                raise self._not_leader()
            return
        if not self._reads_answered():
            leader = self.elector.leader
            raise ReplicaError(f"{self.me} answers no read yet: its log is not checked against the history of "
                               + (f"its leader {leader.url}" if leader is not None and leader.url != self.me
                                  else "a leader (an election is on)")
                               + ", and may hold entries no leader acknowledged; read from another node, or "
                                 "retry shortly")

    def _reads_answered(self) -> bool:
        """Whether :meth:`check_read` lets a read through now (``reads`` in ``GET /v1/cluster``)."""
        if self.role == "leader":
            return self.elector.lease_ok()
        follower = self.follower
        return follower is not None and follower.on_leaders_line

    def _not_leader(self) -> NotLeaderError:
        leader = self.elector.leader
        url = leader.url if leader is not None and leader.url != self.me else None
        return NotLeaderError(f"{self.me} is not the leader of cluster {self.cluster}; "
                              + (f"write to {url}" if url else "an election is on: retry shortly"),
                              leader=url, epoch=self.elector.epoch)

    def _follower_stopped(self, why: str) -> None:
        self._needs = why
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.reopen.set)

    # -- what GET /v1/cluster says ------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        store = self.store
        leader = self.elector.leader
        out: dict[str, Any] = {
            "cluster": self.cluster, "node": self.me, "role": self.role,
            "leader": leader.url if leader is not None else None, "epoch": self.elector.epoch,
            "timeline": store.history[-1].timeline if store is not None else 0,
            "durable_lsn": store.durable_lsn if store is not None else 0,
            "applied_lsn": store.applied_lsn if store is not None else 0,
            "sync_replicas": self.sync_replicas, "lease_seconds": self.elector.lease_seconds,
            "reads": self._reads_answered(),
        }
        last = out["durable_lsn"]
        members = []
        for s in self.elector.members:
            url = s.get("url")
            lsn = int(s.get("lsn", 0) or 0)
            members.append({"url": url, "role": "leader" if leader is not None and url == leader.url else "replica",
                            "timeline": s.get("timeline"), "durable_lsn": lsn, "lag_lsns": max(0, last - lsn)})
        if store is not None and store.replicas is not None and self.role == "leader":
            reported = {r["name"]: r for r in store.replicas.positions(store.last_lsn)}
            for m in members:
                r = reported.get(m["url"])
                if r is not None:
                    m.update(durable_lsn=r["durable_lsn"], lag_lsns=r["lag_lsns"])
        out["members"] = members
        follower = self.follower
        if follower is not None and follower.last_error is not None:
            out["follow_error"] = str(follower.last_error)
        return out


def _close(follower: Follower | None, store: KVStore | None) -> None:
    if follower is not None:
        follower.stop()
    if store is not None:
        try:
            store.close()
        except Exception as exc:  # noqa: BLE001 - a failed log closes with its error: reopened next
            log.warning("closing %s: %s", store.path, exc)

