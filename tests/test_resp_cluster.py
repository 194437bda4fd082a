"""WAIT on a cluster's leader (three ``walkv serve --cluster ... --resp``
nodes, ``--sync-replicas 1``, etcd): it answers how many synchronous
replicas hold the connection's last write, at once when enough do, after
its timeout when a replica is gone (SIGKILL); a replica answers writes with
READONLY."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.cluster_etcd import Etcd, etcd_missing
from tests.cluster_nodes import Cluster, Node
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
