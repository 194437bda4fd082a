"""The cluster contract, point by point, on one healthy three-node cluster
(no faults: tests/test_cluster_faults.py has those), so that a broken
point fails here with its own name:

* every node started alike; one leads, the others follow it
  (``GET /v1/cluster``: the fields, one leader, one epoch, every member);
* a node that does not lead never answers a write with 2xx: 421 NotLeader
  naming the leader and the epoch, for every kind of write;
* a leader's write answers carry ``Walkv-Epoch`` and ``Walkv-Node``;
* reads on any node answer with ``Walkv-Lsn``, and ``min_lsn`` gives
  read-your-writes on a replica;
* ``kvstore.connect([urls])`` finds the leader, writes through it, reads;
  ``kvstore.OutcomeUnknownError`` is a public name;
* the segments a leader writes name its epoch as their timeline;
* a replica restarted with the same command rejoins and catches up.
"""

from __future__ import annotations

import base64
import os
import uuid

import httpx
import pytest

from tests.cluster_checks import read_log
from tests.cluster_etcd import Etcd, etcd_missing
from tests.cluster_nodes import Cluster

pytestmark = [pytest.mark.crash, pytest.mark.skipif(etcd_missing() is not None, reason=str(etcd_missing()))]

FIELDS = {"cluster", "node", "role", "leader", "epoch", "timeline", "durable_lsn", "applied_lsn", "members"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    directory = str(tmp_path_factory.mktemp("contract"))
    with Etcd(str(tmp_path_factory.mktemp("etcd"))) as etcd, \
            Cluster(directory, etcd, name=f"contract-{uuid.uuid4().hex[:8]}") as c:
        c.start()
        c.wait_followed()
        yield c


@pytest.fixture
def http():
    with httpx.Client(timeout=10) as client:
        yield client


def test_one_leader_the_others_follow_it(cluster):
    leader, epoch = cluster.wait_followed()
    statuses = cluster.statuses()
    for name, status in statuses.items():
        assert status is not None and FIELDS <= set(status), (name, status)
        node = next(n for n in cluster.nodes if n.name == name)
        assert status["cluster"] == cluster.name and status["node"] == node.advertise
        assert status["leader"] == leader.advertise and status["epoch"] == epoch
        assert status["role"] == ("leader" if node is leader else "replica")
    members = statuses[leader.name]["members"]
    assert sorted(m["url"] for m in members) == sorted(n.advertise for n in cluster.nodes), members
    assert all({"url", "role", "timeline", "durable_lsn", "lag_lsns"} <= set(m) for m in members), members


WRITES = [
    ("PUT", "/v1/kv/contract-a", {"content": b"1"}),
    ("DELETE", "/v1/kv/contract-a", {}),
    ("POST", "/v1/batch", {"json": {"ops": [{"op": "put", "key": base64.b64encode(b"b").decode(),
                                             "value": base64.b64encode(b"2").decode()}]}}),
    ("POST", "/v1/txn", {"json": {"conditions": [{"key": base64.b64encode(b"c").decode(), "absent": True}],
                                  "ops": [{"op": "put", "key": base64.b64encode(b"c").decode(),
                                           "value": base64.b64encode(b"3").decode()}]}}),
    ("POST", "/v1/delete_range", {"json": {"start": base64.b64encode(b"x").decode(),
                                           "end": base64.b64encode(b"y").decode()}}),
]


@pytest.mark.parametrize("method,path,body", WRITES, ids=[f"{m} {p}" for m, p, _ in WRITES])
def test_a_replica_refuses_every_write_with_421_naming_the_leader(cluster, http, method, path, body):
    leader, epoch = cluster.wait_followed()
    for replica in cluster.replicas(leader):
        resp = http.request(method, replica.direct + path, **body)
        assert resp.status_code == 421, (replica.name, resp.status_code, resp.text)
        error = resp.json()["error"]
        assert error["type"] == "NotLeaderError" and error["leader"] == leader.advertise and error["epoch"] == epoch


def test_a_leader_write_names_its_epoch_and_node_and_replicas_read_it(cluster, http):
    leader, epoch = cluster.wait_followed()
    resp = http.put(leader.direct + "/v1/kv/contract-read", content=b"seen")
    assert resp.status_code == 200, resp.text
    assert resp.headers["Walkv-Epoch"] == str(epoch) and resp.headers["Walkv-Node"] == leader.advertise
    lsn = resp.json()["lsn"]
    for replica in cluster.replicas(leader):
        read = http.get(replica.direct + "/v1/kv/contract-read", params={"min_lsn": lsn})
        assert read.status_code == 200 and read.content == b"seen", (replica.name, read.status_code)
        assert int(read.headers["Walkv-Lsn"]) >= lsn


def test_the_client_follows_the_leader(cluster):
    import kvstore

    assert issubclass(kvstore.OutcomeUnknownError, kvstore.WalkvError)
    leader, _ = cluster.wait_followed()
    urls = [n.advertise for n in reversed(cluster.nodes)]  # the leader need not be first
    with kvstore.connect(urls) as db:
        lsn = db.put(b"contract-client", b"v")
        assert db.compare_and_set(b"contract-client", b"v", b"w")
        assert not db.compare_and_set(b"contract-client", b"v", b"x")
        assert db.get(b"contract-client", min_lsn=lsn) in (b"v", b"w")  # any node: maybe before the cas
        lsn = db.put(b"contract-client", b"z")
        assert db.get(b"contract-client", min_lsn=lsn) == b"z"


def test_a_restarted_replica_rejoins_and_catches_up(cluster, http):
    leader, epoch = cluster.wait_followed()
    replica = cluster.replicas(leader)[0]
    replica.kill()
    lsn = http.put(leader.direct + "/v1/kv/contract-restart", content=b"after").json()["lsn"]
    replica.start()
    cluster.wait_followed()
    read = http.get(replica.direct + "/v1/kv/contract-restart", params={"min_lsn": lsn})
    assert read.status_code == 200 and read.content == b"after"
    assert (replica.status() or {}).get("role") == "replica"


def test_segments_a_leader_writes_name_its_epoch(cluster, http):
    """The logs are read with every node stopped; then all start again
    with the same commands, and lead and follow again."""
    leader, epoch = cluster.wait_followed()
    assert http.put(leader.direct + "/v1/kv/contract-timeline", content=b"t").status_code == 200
    cluster.stop()
    log = read_log(leader.name, os.path.join(leader.store, "wal"))
    assert log.history[-1][0] == epoch, log.history
    assert log.entries[log.last_lsn][0] == epoch
    cluster.start()
    _, again = cluster.wait_followed()
    assert again > epoch
