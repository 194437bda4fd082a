"""A walkv cluster for the benchmarks (:mod:`benchmarks.cluster`): one etcd
member as its coordinator and ``size`` ``walkv serve`` nodes started alike,
as the cluster contract says (``--cluster``, ``--coordinator``,
``--advertise``, ``--sync-replicas``, ``--lease-seconds``), each on a free
loopback port with its store in a directory of its own, durable on every
acknowledged write; a node can be killed (SIGKILL) and started again with
the same command. Which node leads, and in which epoch, is asked of each
node (``GET /v1/cluster``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from benchmarks.processes import free_port
from benchmarks.server_peers import Server, start_etcd_members, start_walkv

POLL = 0.02


def cluster_status(url: str, timeout: float = 1.0) -> dict[str, Any] | None:
    """A node's ``GET /v1/cluster``, or None when it does not answer."""
    try:
        with urllib.request.urlopen(url + "/v1/cluster", timeout=timeout) as resp:
            return json.loads(resp.read())
    except (OSError, urllib.error.URLError, ValueError):
        return None


@dataclass
class WalkvCluster:
    """The running cluster (module docstring)."""

    directory: str
    etcd: Server
    args: list[tuple[str, list[str]]]  # per node: its listen address and the rest of its command
    nodes: list[Server | None] = field(default_factory=list)

    def urls(self) -> list[str]:
        return [f"http://{listen}" for listen, _ in self.args]

    def start(self, i: int) -> None:
        listen, extra = self.args[i]
        directory = os.path.join(self.directory, f"n{i + 1}")
        os.makedirs(directory, exist_ok=True)
        self.nodes[i] = start_walkv(directory, *extra, listen=listen)

    def kill(self, i: int) -> None:
        node = self.nodes[i]
        if node is not None:
            node.proc.kill()
            node.proc.wait()
            self.nodes[i] = None

    def leader(self) -> tuple[int, int] | None:
        """(node index, epoch) of the node every running node names as leader."""
        answers = [(i, cluster_status(url)) for i, url in enumerate(self.urls()) if self.nodes[i] is not None]
        leaders = [(i, s) for i, s in answers if s is not None and s.get("role") == "leader"]
        if not leaders:
            return None
        i, status = max(leaders, key=lambda x: x[1].get("epoch", 0))
        if any(s is None or s.get("leader") != status["node"] for _, s in answers):
            return None
        return i, int(status["epoch"])

    def wait_followed(self, newer_than: int = 0, timeout: float = 60.0) -> tuple[int, int]:
        """A leader above epoch ``newer_than`` that every running node
        follows, each caught up to what it had made durable."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.leader()
            if found is not None and found[1] > newer_than:
                status = cluster_status(self.urls()[found[0]]) or {}
                durable = int(status.get("durable_lsn", 0))
                others = [cluster_status(u) for i, u in enumerate(self.urls()) if self.nodes[i] is not None]
                if all(s is not None and int(s.get("applied_lsn", 0)) >= durable for s in others):
                    return found
            time.sleep(POLL)
        raise RuntimeError(f"no leader above epoch {newer_than} followed by every node within {timeout:.0f} s: "
                           f"{[cluster_status(u) for u in self.urls()]}")

    def cpu_seconds(self) -> float:
        return sum(n.cpu_seconds() for n in self.nodes if n is not None)

    def stop(self) -> None:
        for node in self.nodes:
            if node is not None:
                node.stop()
        self.etcd.stop()


def start_cluster(directory: str, *, size: int = 3, sync_replicas: int = 1, lease_seconds: float = 2.0,
                  name: str = "bench") -> WalkvCluster:
    """etcd and ``size`` nodes, returned once a leader is followed by all."""
    coordinator = os.path.join(directory, "coordinator")
    os.makedirs(coordinator, exist_ok=True)
    etcd = start_etcd_members(coordinator, 1)[0]
    args = []
    for _ in range(size):
        listen = f"127.0.0.1:{free_port()}"
        args.append((listen, ["--cluster", name, "--coordinator", "etcd://" + etcd.url.split("://", 1)[1],
                              "--advertise", f"http://{listen}", "--sync-replicas", str(sync_replicas),
                              "--lease-seconds", f"{lease_seconds:g}"]))
    cluster = WalkvCluster(directory, etcd, args, [None] * size)
    try:
        for i in range(size):
            cluster.start(i)
        cluster.wait_followed()
    except BaseException:
        cluster.stop()
        raise
    return cluster
