"""WAIT on a cluster's leader (three ``walkv serve --cluster ... --resp``
nodes, ``--sync-replicas 1``, etcd): it answers how many synchronous
replicas hold the connection's last write, at once when enough do, after
its timeout when a replica is gone (SIGKILL); a replica answers writes with
READONLY, and reads only once its history is checked against its leader's
(MASTERDOWN before: the HTTP face's rule, kvstore.cluster.node.ClusterNode.check_read)."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.cluster_etcd import Etcd, etcd_missing
from tests.cluster_nodes import Cluster, Node
from tests.cluster_proxy import REFUSE
from tests.resp_fixture import RESP_LISTENING

redis = pytest.importorskip("redis")

pytestmark = [pytest.mark.crash, pytest.mark.skipif(etcd_missing() is not None, reason=str(etcd_missing()))]


def resp_port(node: Node) -> int:
    with open(node.stdout_path) as f:
        found = RESP_LISTENING.findall(f.read())
    assert found, f"{node.name} printed no RESP line:\n{node.log_tail()}"
    return int(re.sub(r".*:", "", found[-1]))


def test_wait_counts_the_synchronous_replicas_holding_the_last_write(tmp_path_factory):
    with Etcd(str(tmp_path_factory.mktemp("etcd"))) as etcd, \
            Cluster(str(tmp_path_factory.mktemp("cluster")), etcd, name=f"wait-{uuid.uuid4().hex[:8]}",
                    extra=("--resp", "127.0.0.1:0")) as cluster:
        cluster.start()
        leader, _ = cluster.wait_followed()
        r = redis.Redis(host="127.0.0.1", port=resp_port(leader), protocol=2, socket_timeout=30)
        replicas = cluster.replicas(leader)
        try:
            assert r.set("k", "v") is True
            assert r.execute_command("WAIT", 1, 0) >= 1  # --sync-replicas 1: held before SET was answered
            assert r.execute_command("WAIT", 2, 10_000) == 2  # both replicas, once the second caught up
            info = r.info("replication")
            assert info["role"] == "master" and info["connected_slaves"] == 2
            assert {info["slave0"]["port"], info["slave1"]["port"]} == {
                int(n.advertise.rsplit(":", 1)[1]) for n in replicas}
            assert min(info["slave0"]["offset"], info["slave1"]["offset"]) >= info["master_repl_offset"] - 1
            with pytest.raises(redis.exceptions.ReadOnlyError):
                redis.Redis(host="127.0.0.1", port=resp_port(replicas[0]), protocol=2).set("k", "w")
            replicas[0].kill()
            assert r.set("k", "v2") is True  # the other replica is enough
            assert r.execute_command("WAIT", 2, 300) == 1  # the killed one never holds it: the timeout answers
            assert r.execute_command("WAIT", 1, 300) == 1
        finally:
            r.close()


def test_a_restarted_replica_answers_no_resp_read_before_its_history_is_checked(tmp_path_factory):
    """A node opened again may hold entries no leader acknowledged (it applied
    them at open): until its follower checked its log against the leader's
    history it answers no read, on RESP as on HTTP. Here its link to the
    leader refuses, so GET, MGET, EXISTS, SCAN and DBSIZE answer MASTERDOWN
    (redis-py's MasterDownError) and serve nothing; once the link passes and
    it follows, they are answered."""
    with Etcd(str(tmp_path_factory.mktemp("etcd"))) as etcd, \
            Cluster(str(tmp_path_factory.mktemp("cluster")), etcd, name=f"reads-{uuid.uuid4().hex[:8]}",
                    extra=("--resp", "127.0.0.1:0")) as cluster:
        cluster.start()
        leader, _ = cluster.wait_followed()
        with redis.Redis(host="127.0.0.1", port=resp_port(leader), protocol=2, socket_timeout=30) as r:
            assert r.set("rejoin", "v") is True
            assert r.execute_command("WAIT", 2, 10_000) == 2
        replica = cluster.replicas(leader)[0]
        replica.kill()
        cluster.network.set(replica.name, leader.name, REFUSE)
        try:
            replica.start()
            status = replica.wait_knows_leader(leader)  # (from etcd; its follower is refused by that leader)
            assert status is not None and status.get("reads") is False, status
            with redis.Redis(host="127.0.0.1", port=resp_port(replica), protocol=2, socket_timeout=30) as c:
                for read in (lambda: c.get("rejoin"), lambda: c.mget("rejoin", "other"),
                             lambda: c.exists("rejoin"), lambda: c.scan(0), c.dbsize):
                    with pytest.raises(redis.exceptions.MasterDownError, match="answers no read yet"):
                        read()
                assert c.ping() is True  # what reads no key is answered
        finally:
            cluster.network.heal()
        cluster.wait_followed()
        with redis.Redis(host="127.0.0.1", port=resp_port(replica), protocol=2, socket_timeout=30) as c:
            assert c.get("rejoin") == b"v" and c.mget("rejoin", "other") == [b"v", None] and c.exists("rejoin") == 1
