"""Electing a cluster's one writer through etcd, and fencing it
(:class:`Elector`). Never a home-made consensus: etcd's Raft decides who
holds the ``leader`` key; this module only decides who may ask for it.

Keys, under ``/walkv/<cluster>/`` (values JSON)::

    members/<url>   {"url"}: every node that ever joined (no lease): the
                    cluster's size N, for the quorum rule below
    status/<url>    {"url", "timeline", "lsn", "top", "frozen"}: the node's
                    log position (the timeline number of its last entry, its
                    last durable LSN, the newest timeline its history holds),
                    attached to its lease (gone with it)
    held/<url>      {"timeline"}: the newest timeline this node ever let
                    anyone count on (no lease: it outlives the node's disk)
    leader          {"url", "epoch"}: the writer, attached to ITS lease
    epoch           the highest epoch ever elected (no lease)

Rules, and why:

* The leader key exists only while its node's lease lives (etcd deletes it
  when the lease expires: a crash, a pause, a partition from etcd). It is
  created in one transaction that also raises ``epoch``, guarded by
  "``leader`` does not exist" and "``epoch`` is unchanged since I read it":
  exactly one node wins each vacancy, and epochs only grow.
* The epoch is the fencing token and the new leader's timeline number
  (:mod:`wal.timeline`): ``max(epoch, my timeline) + 1``. The winner begins
  that timeline at its next LSN; replicas count only reports of the current
  epoch (:mod:`kvstore.store.replication`), and followers refuse a leader of
  an older one (:mod:`kvstore.cluster.follower`).
* Who may ask (Raft's "up-to-date" rule, over etcd): when the leader key is
  gone, every node stops following and publishes its final position with
  ``frozen: true``. A node asks only when it sees frozen positions of at
  least ``N - K`` members (``K`` = sync replicas; a majority when K = 0),
  its own included, and none of them ahead of its own (timeline number
  first, then LSN; a tie goes to the lower URL). Every write acknowledged
  with K replicas is on K + 1 nodes, so any N - K of them include one that
  holds it, and the most advanced of them holds every acknowledged write.
  With fewer reachable the cluster waits rather than lose a write. (With
  K = 0 a write lives on its leader alone until a follower fetched it: a
  failover may lose the last moments' writes, as an asynchronous
  PostgreSQL standby does; the docs say so.)
* That argument assumes no disk goes back in time, and a disk can: a VM
  restored from an image, a directory put back from a copy, a device that
  lied about an fsync. A node so rolled back may have lost the only other
  copy of an acknowledged write, and counting it among the N - K would let
  two nodes that lack the write elect one of them (found by the stale-disk
  fault of tests/test_cluster_faults.py). So etcd remembers what a disk can
  forget: before a node lets anyone count on its log holding a timeline (a
  leader before it takes its epoch's first write, a replica before it
  reports an entry of a timeline to its leader), it records that timeline
  in ``held/<url>``, which only grows. A frozen member whose history's
  newest timeline (``top``) is older than its ``held`` went back in time:
  it does not count among the N - K (it may still be elected, by N - K
  others; it counts again once it holds that timeline again). The record
  is per timeline, one etcd write per node per epoch: a disk put back to an
  earlier point of the same timeline is not seen, as Raft, which assumes
  stable storage, would not see it either.
* The lease is renewed every third of its length. The leader counts its
  lease from the moment it SENT the renewal that etcd confirmed, minus a
  margin (:data:`LEASE_MARGIN` of the lease): by its own monotonic clock it
  stops acknowledging before etcd can have let the lease go, provided the
  two clocks' rates differ by less than the margin. What that does not
  cover: a process paused after its last check and before its answer left
  (the write was on K replicas by then; with K = 0 it may be lost).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kvstore.cluster.etcd import Etcd, KeyValue, prefix_end
from wal.errors import CoordinatorError

log = logging.getLogger("walkv.cluster")

LEASE_MARGIN = 0.2
"""The share of its lease a leader gives up at its end (module docstring)."""


@dataclass(frozen=True)
class Position:
    """A node's log position: the timeline number of its last entry, and
    that entry's LSN; ``top``, the highest timeline number its history holds
    (a new epoch must be above it)."""

    timeline: int
    lsn: int
    top: int = 0

    def key(self) -> tuple[int, int]:
        return (self.timeline, self.lsn)


@dataclass(frozen=True)
class Leader:
    url: str
    epoch: int


class Elector:
    """One node's part in its cluster's election (module docstring).

    ``position()`` is the node's log position now; ``frozen()`` whether it
    stopped following (no leader); ``on_change(leader)`` is awaited when the
    leader this node knows changes (None: none), including when it is this
    node (``leader.url == me``)."""

    def __init__(self, etcd: Etcd, cluster: str, me: str, *, lease_seconds: float, sync_replicas: int,
                 position: Callable[[], Position], frozen: Callable[[], bool],
                 on_change: Callable[[Leader | None], Awaitable[None]]) -> None:
        if not cluster or "/" in cluster:
            raise ValueError(f"a cluster name is a non-empty name without '/', not {cluster!r}")
        self.etcd = etcd
        self.cluster = cluster
        self.me = me
        self.lease_seconds = max(1, int(round(lease_seconds)))  # etcd may grant more: its own minimum
        self.sync_replicas = sync_replicas
        self._position = position
        self._frozen = frozen
        self._on_change = on_change
        root = f"/walkv/{cluster}/".encode()
        self._members = root + b"members/"
        self._status = root + b"status/"
        self._leader_key = root + b"leader"
        self._epoch_key = root + b"epoch"
        self._held_key = root + b"held/"
        self.held = 0
        """The timeline this node's ``held/<url>`` is known to record (:meth:`hold`)."""
        self.leader: Leader | None = None
        self.epoch = 0
        self.lease = 0
        self.lease_valid_until = 0.0  # time.monotonic(); meaningful while leading
        self.members: list[dict[str, Any]] = []  # the statuses last read (GET /v1/cluster)
        self._members_at = 0.0
        self._published: dict[str, Any] | None = None
        self._published_at = 0.0
        self._stopping = asyncio.Event()
        self.last_error: BaseException | None = None
        self._warned_rolled_back: set[str] = set()

    @property
    def leading(self) -> bool:
        return self.leader is not None and self.leader.url == self.me

    def lease_ok(self) -> bool:
        """May the leader acknowledge now (its lease, by its own clock)?"""
        return self.leading and time.monotonic() < self.lease_valid_until

    # -- the loop ---------------------------------------------------------------------

    async def run(self) -> None:
        tick = min(0.1, self.lease_seconds / 20)
        renew_every = self.lease_seconds / 3
        renewed = 0.0
        while not self._stopping.is_set():
            try:
                if not self.lease:
                    await self._join()
                    renewed = time.monotonic()
                elif time.monotonic() - renewed >= renew_every:
                    await self._renew()
                    renewed = time.monotonic()
                await self._look()
                if self.last_error is not None:
                    log.warning("cluster %s: %s reaches etcd again", self.cluster, self.me)
                    self.last_error = None
            except CoordinatorError as exc:
                if self.last_error is None:
                    log.warning("cluster %s: %s: %s", self.cluster, self.me, exc)
                self.last_error = exc
                if self.leading and not self.lease_ok():
                    await self._set_leader(None, "its lease could not be renewed in time")
            except Exception as exc:  # noqa: BLE001 - a bug must not end the node's part in the election
                log.exception("cluster %s: %s: the election loop met %s; it goes on", self.cluster, self.me, exc)
                self.last_error = exc
            try:
                await asyncio.wait_for(self._stopping.wait(), tick)
            except TimeoutError:
                pass

    async def _join(self) -> None:
        sent = time.monotonic()
        self.lease, granted = await self.etcd.grant(self.lease_seconds)
        self.lease_valid_until = sent + granted * (1 - LEASE_MARGIN)
        await self.etcd.put(self._members + self.me.encode(), json.dumps({"url": self.me}).encode())
        self._published = None
        log.info("cluster %s: %s joined (lease %x, %d s)", self.cluster, self.me, self.lease, self.lease_seconds)

    async def _renew(self) -> None:
        sent = time.monotonic()
        left = await self.etcd.keep_alive(self.lease)
        if left <= 0:  # it expired: etcd deleted our keys, the leader key included
            self.lease = 0
            if self.leading:
                await self._set_leader(None, "its lease expired")
            return
        self.lease_valid_until = sent + left * (1 - LEASE_MARGIN)

    async def hold(self, timeline: int) -> None:
        """Record in etcd that this node's log holds ``timeline``, before
        anyone counts on it (module docstring); the record only grows.
        :class:`~wal.errors.CoordinatorError` when etcd cannot be reached:
        then nobody may count on it yet."""
        if timeline <= self.held:
            return
        key = self._held_key + self.me.encode()
        found = await self.etcd.get(key)
        recorded = int(_json(found).get("timeline", 0) or 0) if found is not None else 0
        if timeline > recorded:
            await self.etcd.put(key, json.dumps({"timeline": timeline}).encode())
        self.held = max(timeline, recorded)

    async def _publish(self) -> None:
        pos = self._position()
        status = {"url": self.me, "timeline": pos.timeline, "lsn": pos.lsn, "top": pos.top, "frozen": self._frozen()}
        now = time.monotonic()
        if status != self._published or now - self._published_at >= 1.0:
            await self.etcd.put(self._status + self.me.encode(), json.dumps(status).encode(), self.lease)
            self._published, self._published_at = status, now

    async def _look(self) -> None:
        if not self.lease:  # it just expired (_renew): join again first, for no key may be made without one
            return
        await self._publish()
        now = time.monotonic()
        if now - self._members_at >= 1.0:
            self.members = [_json(kv) for kv in await self.etcd.range(self._status, prefix_end(self._status))]
            self._members_at = now
        found = await self.etcd.get(self._leader_key)
        leader = _leader_of(found)
        if leader is not None:
            if leader.url == self.me and found is not None and found.lease != self.lease:
                # our own key from before a restart: that process is gone; let its lease go now
                log.info("cluster %s: %s revokes the leader lease of its previous run", self.cluster, self.me)
                if found.lease:
                    await self.etcd.revoke(found.lease)
                else:  # made without a lease (an older walkv's bug): no lease to revoke, so the key itself
                    await self.etcd.delete_if_lease(self._leader_key, 0)
                leader = None
            elif leader != self.leader:
                await self._set_leader(leader, "elected")
            if leader is not None:
                return
        if self.leader is not None:
            await self._set_leader(None, "the leader's lease is gone")
            return  # followers freeze, then ask on the next look
        if self._frozen():
            await self._campaign()

    async def _campaign(self) -> None:
        members = await self.etcd.range(self._members, prefix_end(self._members))
        statuses = [_json(kv) for kv in await self.etcd.range(self._status, prefix_end(self._status))]
        frozen = [s for s in statuses if s.get("frozen") is True]
        self.members = statuses
        n = len(members)
        k = self.sync_replicas
        needed = n - k if k > 0 else n // 2 + 1
        mine = self._position()
        me_key = (mine.timeline, mine.lsn)
        if len(frozen) < max(1, needed):
            return
        counted = await self._counted(frozen)
        if len(counted) < max(1, needed):
            return
        for s in frozen:
            other = (int(s.get("timeline", 0)), int(s.get("lsn", 0)))
            if other > me_key or (other == me_key and str(s.get("url")) < self.me):
                return
        epoch_kv = await self.etcd.get(self._epoch_key)
        old = int(epoch_kv.value) if epoch_kv is not None else 0
        epoch = max(old, mine.timeline, mine.top) + 1
        doc = json.dumps({"url": self.me, "epoch": epoch}).encode()
        sent = time.monotonic()
        won, _ = await self.etcd.create(
            [(self._leader_key, doc, self.lease), (self._epoch_key, str(epoch).encode(), None)],
            absent=self._leader_key, mod_revision=(self._epoch_key, epoch_kv.mod_revision if epoch_kv else 0))
        if won:
            self.lease_valid_until = min(self.lease_valid_until, sent + self.lease_seconds * (1 - LEASE_MARGIN))
            log.warning("cluster %s: %s is the leader at epoch %d (position %s, %d of %d members frozen)",
                        self.cluster, self.me, epoch, me_key, len(frozen), n)
            await self._set_leader(Leader(self.me, epoch), "won")

    async def _counted(self, frozen: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The frozen statuses that count among the N - K: those whose disk
        did not go back in time (module docstring)."""
        held = {}
        for kv in await self.etcd.range(self._held_key, prefix_end(self._held_key)):
            held[kv.key[len(self._held_key):].decode(errors="replace")] = int(_json(kv).get("timeline", 0) or 0)
        counted = []
        for s in frozen:
            url = str(s.get("url"))
            top = int(s.get("top", s.get("timeline", 0)) or 0)
            if top >= held.get(url, 0):
                counted.append(s)
                self._warned_rolled_back.discard(url)
            elif url not in self._warned_rolled_back:
                self._warned_rolled_back.add(url)
                log.warning("cluster %s: %s does not count %s among the frozen members: its history's newest "
                            "timeline is %d, and it once held timeline %d (its disk went back in time); it counts "
                            "again once it holds that timeline", self.cluster, self.me, url, top, held[url])
        return counted

    async def _set_leader(self, leader: Leader | None, why: str) -> None:
        was = self.leader
        self.leader = leader
        if leader is not None:
            self.epoch = max(self.epoch, leader.epoch)
        if was == leader:
            return
        if leader is None:
            log.warning("cluster %s: %s sees no leader (%s)", self.cluster, self.me, why)
        elif leader.url != self.me:
            log.info("cluster %s: %s follows %s at epoch %d", self.cluster, self.me, leader.url, leader.epoch)
        await self._on_change(leader)

    async def resign(self) -> None:
        """Stop leading (a failed log, a stop): let the leader key go if it is still ours."""
        if self.leading and self.lease:
            try:
                await self.etcd.delete_if_lease(self._leader_key, self.lease)
            except CoordinatorError:
                pass
        self.leader = None

    async def stop(self) -> None:
        self._stopping.set()
        await self.resign()
        if self.lease:
            try:
                await self.etcd.revoke(self.lease)
            except CoordinatorError:
                pass
            self.lease = 0


def _json(kv: KeyValue) -> dict[str, Any]:
    try:
        doc = json.loads(kv.value)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _leader_of(kv: KeyValue | None) -> Leader | None:
    if kv is None:
        return None
    doc = _json(kv)
    url, epoch = doc.get("url"), doc.get("epoch")
    if not isinstance(url, str) or type(epoch) is not int:
        return None
    return Leader(url, epoch)
