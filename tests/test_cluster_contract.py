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
* ``kvstore.connect([urls])`` and ``kvstore.connect_async([urls])`` find
  the leader, write through it, read; ``kvstore.OutcomeUnknownError`` is a
  public name;
* the leader's ``stats()``, ``/metrics`` and ``walkv stats URL`` show each
  synchronous replica's durable LSN and lag;
* a write sent to a leader that stops answering (SIGSTOP) has an unknown
  outcome: a compare-and-set raises ``OutcomeUnknownError`` and is never sent
  again, a put is sent again and lands on the next leader;
* the segments a leader writes name its epoch as their timeline;
* a replica restarted with the same command rejoins and catches up.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
import uuid

import httpx
import pytest

from kvstore.cli.main import main
from tests.cluster_checks import read_log
from tests.cluster_etcd import Etcd, etcd_missing
from tests.cluster_nodes import Cluster
from tests.cluster_proxy import REFUSE

pytestmark = [pytest.mark.crash, pytest.mark.skipif(etcd_missing() is not None, reason=str(etcd_missing()))]

FIELDS = {"cluster", "node", "role", "leader", "epoch", "timeline", "durable_lsn", "applied_lsn", "reads", "members"}


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
    """Between two leaders (a lease lost on a loaded machine is a failover
    like any other) the 421 names none, and says an election is on: then
    the cluster is waited for again, and asked again."""
    for attempt in range(3):
        leader, epoch = cluster.wait_followed()
        errors = []
        for replica in cluster.replicas(leader):
            resp = http.request(method, replica.direct + path, **body)
            assert resp.status_code == 421, (replica.name, resp.status_code, resp.text)
            errors.append(resp.json()["error"])
        assert all(e["type"] == "NotLeaderError" for e in errors), errors
        if all(e["leader"] is not None for e in errors):
            break
        assert all(e["leader"] is not None or "an election is on" in e["message"] for e in errors), errors
    assert all(e["leader"] == leader.advertise and e["epoch"] == epoch for e in errors), (attempt, errors)


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


def test_the_async_client_follows_the_leader(cluster):
    import kvstore

    cluster.wait_followed()

    async def go() -> None:
        async with kvstore.connect_async([n.advertise for n in reversed(cluster.nodes)]) as db:
            lsn = await db.put(b"contract-async", b"a")
            assert await db.compare_and_set(b"contract-async", b"a", b"b")
            assert not await db.compare_and_set(b"contract-async", b"a", b"c")
            assert await db.get(b"contract-async", min_lsn=lsn + 1) == b"b"

    asyncio.run(go())


def test_the_leader_shows_each_replica_s_durable_lsn_and_lag(cluster, http, capsys):
    leader, epoch = cluster.wait_followed()
    lsn = http.put(leader.direct + "/v1/kv/contract-stats", content=b"s").json()["lsn"]
    replicas = sorted(n.advertise for n in cluster.replicas(leader))
    stats = http.get(leader.direct + "/v1/stats").json()["sync_replicas"]
    assert stats["required"] == 1 and stats["epoch"] == epoch
    assert sorted(r["name"] for r in stats["replicas"]) == replicas, stats
    assert any(r["durable_lsn"] >= lsn for r in stats["replicas"]), stats  # the one that confirmed the put
    assert all(r["lag_lsns"] >= 0 and r["epoch"] == epoch for r in stats["replicas"]), stats
    metrics = http.get(leader.direct + "/metrics").text
    for url in replicas:
        for name in ("walkv_sync_replica_durable_lsn", "walkv_sync_replica_lag_lsns"):
            assert any(line.startswith(name + "{") and f'replica="{url}"' in line for line in metrics.splitlines()), \
                (name, url, metrics)
    assert main(["stats", leader.direct, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["sync_replicas"]["replicas"]
    assert sorted(r["name"] for r in shown) == replicas
    assert main(["stats", leader.direct]) == 0
    table = capsys.readouterr().out
    assert all(url in table for url in replicas) and "durable LSN" in table and "behind" in table, table


def test_an_unknown_outcome_is_sent_again_only_when_idempotent(cluster):
    """The leader is stopped (SIGSTOP) with both writes on their way to it:
    the connection takes them and nothing answers. The compare-and-set
    raises OutcomeUnknownError (sent again, it would have succeeded on the
    next leader); the put is sent again until a new leader acknowledges it."""
    import kvstore

    leader, epoch = cluster.wait_followed()
    urls = [n.advertise for n in cluster.nodes]
    outcome: dict[str, object] = {}
    with kvstore.connect(urls, timeout=0.5) as cas_db, kvstore.connect(urls, timeout=0.5) as put_db:
        for db in (cas_db, put_db):  # each knows the leader, and holds a connection to it
            db.put(b"contract-unknown-warm", b"w")

        def cas() -> None:
            try:
                outcome["cas"] = cas_db.compare_and_set(b"contract-unknown-cas", None, b"once")
            except kvstore.OutcomeUnknownError as exc:
                outcome["cas"] = exc

        def put() -> None:
            outcome["put"] = put_db.put(b"contract-unknown-put", b"landed")

        leader.pause()
        try:
            threads = [threading.Thread(target=cas), threading.Thread(target=put)]
            for t in threads:
                t.start()
            threads[0].join(30)
            new_leader, _ = cluster.wait_for_leader(newer_than=epoch, among=cluster.replicas(leader))
            threads[1].join(60)
        finally:
            leader.resume()
    assert isinstance(outcome.get("cas"), kvstore.OutcomeUnknownError), outcome
    put_lsn = outcome.get("put")
    assert isinstance(put_lsn, int), outcome
    with kvstore.connect([new_leader.advertise]) as db:
        assert db.get(b"contract-unknown-put", min_lsn=put_lsn) == b"landed"
    cluster.wait_followed()


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


def test_a_restarted_node_answers_no_read_before_its_history_is_checked(cluster, http):
    """A node opened again may hold entries it wrote while it led and no
    replica confirmed (its state applied them at open): it answers no read
    until its follower checked its log against its leader's history. Here the
    restarted replica learns the leader from etcd but cannot reach it (its
    link to the leader refuses), so it refuses reads with 503 (ReplicaError)
    and serves none; once the link passes, it follows and reads are answered."""
    leader, _ = cluster.wait_followed()
    lsn = http.put(leader.direct + "/v1/kv/contract-rejoin", content=b"v").json()["lsn"]
    replica = cluster.replicas(leader)[0]
    replica.kill()
    cluster.network.set(replica.name, leader.name, REFUSE)
    try:
        replica.start()
        status = replica.wait_knows_leader(leader)  # (from etcd: its follower tries that leader, refused)
        assert status is not None and status.get("leader") == leader.advertise, status
        read = http.get(replica.direct + "/v1/kv/contract-rejoin")
        assert read.status_code == 503, (read.status_code, read.text)
        assert read.json()["error"]["type"] == "ReplicaError" and "answers no read yet" in read.text, read.text
        assert (replica.status() or {}).get("reads") is False
    finally:
        cluster.network.heal()
    cluster.wait_followed()
    read = http.get(replica.direct + "/v1/kv/contract-rejoin", params={"min_lsn": lsn})
    assert (read.status_code, read.content) == (200, b"v")


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
