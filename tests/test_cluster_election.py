"""The election (kvstore/cluster/election.py) against a real etcd:

* its lease clock: a leader counts its lease from the moment it SENT the
  request etcd confirmed, by its own monotonic clock, less LEASE_MARGIN of
  it, so it stops acknowledging before etcd can let the lease go, and it
  does so without any answer from etcd (a paused or partitioned leader
  hears none);
* who may ask: a member whose disk went back in time (its history's newest
  timeline older than the one etcd says it held) does not count among the
  N - K frozen members.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from kvstore.cluster.election import LEASE_MARGIN, Elector, Leader, Position
from kvstore.cluster.etcd import Etcd as EtcdClient
from tests.cluster_etcd import Etcd, etcd_missing

pytestmark = pytest.mark.skipif(etcd_missing() is not None, reason=str(etcd_missing()))


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory):
    with Etcd(str(tmp_path_factory.mktemp("etcd"))) as server:
        yield server


def test_a_leader_that_hears_nothing_stops_by_its_own_clock_before_its_lease_ends(etcd):
    async def go() -> None:
        client = EtcdClient(etcd.coordinator())
        changes: list[Leader | None] = []

        async def on_change(leader: Leader | None) -> None:
            changes.append(leader)

        me = "http://127.0.0.1:1"
        elector = Elector(client, f"lease-{uuid.uuid4().hex[:8]}", me, lease_seconds=1, sync_replicas=0,
                          position=lambda: Position(0, 0), frozen=lambda: True, on_change=on_change)
        try:
            sent = time.monotonic()
            await elector._join()
            answered = time.monotonic()
            # the fixture's etcd grants the 1 s asked; counted from the send (between these two), less the margin
            assert sent + (1 - LEASE_MARGIN) <= elector.lease_valid_until <= answered + (1 - LEASE_MARGIN)
            await elector._publish()   # its position, frozen
            await elector._campaign()  # the only member: it wins
            assert elector.leading and elector.lease_ok() and changes == [Leader(me, 1)]
            leader_key = await client.get(f"/walkv/{elector.cluster}/leader".encode())
            assert leader_key is not None and leader_key.lease == elector.lease
            while elector.lease_ok():  # no renewal, no answer from etcd: the clock alone ends it
                await asyncio.sleep(0.01)
            assert elector.leading and changes == [Leader(me, 1)]  # nobody told it; it still thinks it leads
        finally:
            await elector.stop()
            await client.close()

    asyncio.run(go())


def test_a_leader_whose_fence_refused_a_write_lets_its_key_go_and_an_election_follows(etcd, tmp_path):
    """Its lease lapsed by its own clock (a loaded machine) while etcd still
    held its key, and its renewal then succeeded: the write it was making
    was refused, its store reopened as a replica's. It must not keep the
    leader key while refusing every write (the cluster stood still, found by
    benchmarks/cluster.py at load 10): it resigns, and leads again on a new
    epoch once the election picks it."""
    from kvstore.cluster.node import ClusterNode
    from wal.errors import FencedError

    async def go() -> None:
        node = ClusterNode(str(tmp_path / "n"), cluster=f"fence-{uuid.uuid4().hex[:8]}",
                           coordinator=etcd.coordinator(), advertise="http://127.0.0.1:1", lease_seconds=1)
        try:
            await node.open()
            await _until(lambda: node.role == "leader")
            epoch = node.elector.epoch
            valid_until = node.elector.lease_valid_until
            node.elector.lease_valid_until = 0.0   # the lease lapsed by its clock, before the renewal came
            with pytest.raises(FencedError):
                node._fence(1)
            node.elector.lease_valid_until = valid_until
            await _until(node.reopen.is_set)
            await node.close_store()               # what walkv serve does then
            await node.open()
            await _until(lambda: node.role == "leader" and node.elector.epoch > epoch)
        finally:
            await node.close()

    asyncio.run(go())


def test_a_member_whose_lease_expired_makes_no_key_until_it_joined_again(etcd):
    """A lease can run out while its node does not lead (a loaded machine,
    a pause). Publishing or campaigning with it then made keys WITHOUT a
    lease: a status that never goes, or a leader key nobody can take over
    (the node itself revoked it as "of a previous run" ever after, found by
    the stale-disk fault's soak). It joins again first."""
    async def go() -> None:
        client = EtcdClient(etcd.coordinator())

        async def on_change(leader: Leader | None) -> None:
            pass

        me = "http://127.0.0.1:1"
        elector = Elector(client, f"expired-{uuid.uuid4().hex[:8]}", me, lease_seconds=1, sync_replicas=0,
                          position=lambda: Position(1, 5, 1), frozen=lambda: True, on_change=on_change)
        root = f"/walkv/{elector.cluster}/".encode()
        try:
            await elector._join()
            await client.revoke(elector.lease)  # as etcd lets a lease go that was not renewed in time
            await elector._renew()
            assert elector.lease == 0
            await elector._look()
            assert await client.get(root + b"leader") is None
            assert await client.get(root + b"status/" + me.encode()) is None
            await client.put(root + b"leader", b'{"url": "%s", "epoch": 2}' % me.encode())  # as that bug left it
            await elector._join()
            await elector._look()  # its own key without a lease is deleted (no lease to revoke); the only
            # member, frozen, it then wins, under its new lease
            leader = await client.get(root + b"leader")
            assert elector.leading and leader is not None and leader.lease == elector.lease != 0
        finally:
            await elector.stop()
            await client.close()

    asyncio.run(go())


def _members(client: EtcdClient, cluster: str, positions: dict[str, Position], frozen: dict[str, bool],
             changes: list[Leader | None]) -> dict[str, Elector]:
    async def on_change(leader: Leader | None) -> None:
        changes.append(leader)

    return {url: Elector(client, cluster, url, lease_seconds=5, sync_replicas=1,
                         position=lambda url=url: positions[url], frozen=lambda url=url: frozen[url],
                         on_change=on_change) for url in positions}


@pytest.mark.parametrize("rolled_back", [True, False], ids=["disk-went-back", "control"])
def test_a_member_whose_disk_went_back_in_time_does_not_count_among_the_frozen(etcd, rolled_back):
    """Three members, one synchronous replica (N - K = 2), as the stale-disk
    fault of tests/test_cluster_faults.py leaves them: n3 led epoch 3 and
    its writes were confirmed by n1 alone; n3's disk was then put back to
    a copy at (2, 96), where n2 is too. With n2 and n3 frozen and n1 not
    yet, neither may be elected (the control, n3 never having held timeline
    3, shows that n2 would be): n1 freezes and wins."""
    n1, n2, n3 = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"
    positions = {n1: Position(3, 539, 3), n2: Position(2, 96, 2), n3: Position(3, 539, 3)}
    frozen = {n1: False, n2: True, n3: True}

    async def go() -> None:
        client = EtcdClient(etcd.coordinator())
        changes: list[Leader | None] = []
        electors = _members(client, f"held-{uuid.uuid4().hex[:8]}", positions, frozen, changes)
        try:
            for elector in electors.values():
                await elector._join()
            if rolled_back:
                await electors[n3].hold(3)     # it led epoch 3, as _lead records
            positions[n3] = Position(2, 96, 2)  # its old directory put back
            for elector in electors.values():
                await elector._publish()
            await electors[n2]._campaign()
            await electors[n3]._campaign()
            if not rolled_back:
                assert changes == [Leader(n2, 3)]  # what happened in the stale-disk fault before the rule
                return
            assert changes == [] and not electors[n2].leading and not electors[n3].leading
            frozen[n1] = True
            for elector in electors.values():
                await elector._publish()
                await elector._campaign()
            assert changes == [Leader(n1, 4)], changes
        finally:
            for elector in electors.values():
                await elector.stop()
            await client.close()

    asyncio.run(go())


async def _until(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)
