"""The election's lease clock (kvstore/cluster/election.py) against a real
etcd: a leader counts its lease from the moment it SENT the request etcd
confirmed, by its own monotonic clock, less LEASE_MARGIN of it, so it stops
acknowledging before etcd can let the lease go, and it does so without any
answer from etcd (a paused or partitioned leader hears none).
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
