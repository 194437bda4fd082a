"""walkv cluster nodes as the tests run them: real ``walkv serve`` processes
started as the cluster contract says (every node alike), on loopback, each
behind its proxy (:mod:`tests.cluster_proxy`), all reaching etcd through
etcd's proxy.

:class:`Node` is one process: its store directory, its own port (the test's
clients use it directly, no proxy in between), the URL it advertises (its
proxy's), and the command it was started with, so that it can be killed
(SIGKILL), paused (SIGSTOP/SIGCONT), stopped (SIGTERM) and restarted with
the same command. Its stdout and stderr go to files beside the store
(appended across restarts, a marker line at each start), where the test's
report and a failure's message read them. A node dies with the test
process (``PR_SET_PDEATHSIG``), so a killed pytest leaves none behind; start
nodes from one long-lived thread (the test's), as the signal follows the
thread that started the process.

:class:`Cluster` is etcd's proxy and N nodes, with what the tests ask of
them: each node's ``GET /v1/cluster``, waiting for a leader (a newer one
after a fault), for every node to follow it, and stopping everything.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from typing import Any

import httpx

from benchmarks import processes
from benchmarks.processes import free_port
from tests.cluster_etcd import Etcd
from tests.cluster_proxy import Network
from tests.server_fixture import LISTENING, ROOT, child_env, serve_command

START_TIMEOUT = 60.0
STATUS_TIMEOUT = 1.0
POLL = 0.05
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Node:
    """One ``walkv serve`` cluster node (module docstring)."""

    def __init__(self, name: str, directory: str, *, cluster: str, coordinator: str, network: Network,
                 sync_replicas: int, lease_seconds: float, extra: Iterable[str] = ()) -> None:
        self.name = name
        self.directory = directory
        self.store = os.path.join(directory, "store")
        self.listen_port = free_port()
        self.direct = f"http://127.0.0.1:{self.listen_port}"
        self.network = network
        self.advertise = f"http://127.0.0.1:{network.proxy(name, self.listen_port)}"
        self.argv = serve_command(self.store, "--listen", f"127.0.0.1:{self.listen_port}", "--cluster", cluster,
                                  "--coordinator", coordinator, "--advertise", self.advertise,
                                  "--sync-replicas", str(sync_replicas), "--lease-seconds", f"{lease_seconds:g}",
                                  *extra)
        self.stdout_path = os.path.join(directory, "stdout.log")
        self.stderr_path = os.path.join(directory, "stderr.log")
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.paused = False
        self._http = httpx.Client(timeout=STATUS_TIMEOUT)

    # -- the process ----------------------------------------------------------------------------

    def launch(self) -> None:
        """Start the process (the same command every time); :meth:`wait_listening` waits for it."""
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        os.makedirs(self.directory, exist_ok=True)
        self.starts += 1
        marker = f"=== {self.name} start {self.starts} at {time.strftime('%H:%M:%S')}: {' '.join(self.argv)}\n"
        with open(self.stdout_path, "a") as out, open(self.stderr_path, "a") as err:
            out.write(marker)
            err.write(marker)
            out.flush()
            self._stdout_from = out.tell()
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env=child_env(), cwd=ROOT, preexec_fn=_die_with_parent)
        self.paused = False
        self.network.register(self.name, self.proc.pid)

    def wait_listening(self, timeout: float = START_TIMEOUT) -> None:
        """Until this start printed ``walkv: listening on URL``."""
        assert self.proc is not None

        def ready() -> bool:
            with open(self.stdout_path) as f:
                f.seek(self._stdout_from)
                return LISTENING.search(f.read()) is not None

        processes.wait_ready(self.proc, ready, f"node {self.name}", timeout=timeout, log_tail=self.log_tail)

    def start(self) -> None:
        self.launch()
        self.wait_listening()

    def kill(self) -> None:
        """SIGKILL (a crash: nothing is flushed or closed), and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: the process stops where it is (a long GC pause, a frozen VM)."""
        assert self.alive(), f"{self.name} is not running"
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> int | None:
        """SIGTERM (SIGKILL after 10 s); the exit code (None if it was not running)."""
        if self.proc is None:
            return None
        if self.paused:
            self.resume()
        return processes.stop(self.proc)

    def restart(self) -> None:
        """Kill it if it runs, then start it again with the same command and directory."""
        self.kill()
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    # -- asking it ------------------------------------------------------------------------------

    def status(self) -> dict[str, Any] | None:
        """``GET /v1/cluster`` on its own port; None when it does not answer in time."""
        if not self.alive() or self.paused:
            return None
        try:
            resp = self._http.get(self.direct + "/v1/cluster")
        except httpx.HTTPError:
            return None
        return resp.json() if resp.status_code == 200 else None

    def wait_knows_leader(self, leader: Node, timeout: float = 30.0) -> dict[str, Any] | None:
        """Wait until its status names ``leader`` as the leader (it learns that from etcd, whether or
        not its link to the leader passes); returns the last status, for the caller's assertion."""
        deadline = time.monotonic() + timeout
        while (status := self.status()) is None or status.get("leader") != leader.advertise:
            if time.monotonic() >= deadline:
                return status
            time.sleep(POLL)
        return status

    def log_tail(self, lines: int = 30) -> str:
        """The end of its stderr (all starts), for failure messages."""
        try:
            with open(self.stderr_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no stderr)"

    def stderr(self) -> str:
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def close(self) -> None:
        self.kill()
        self._http.close()

    def __repr__(self) -> str:
        return f"<node {self.name} {self.direct} (advertises {self.advertise})>"


class Cluster:
    """etcd's proxy and ``size`` nodes of one cluster (module docstring); a
    context manager that kills every node and closes the network."""

    def __init__(self, directory: str, etcd: Etcd, *, name: str, size: int = 3, sync_replicas: int = 1,
                 lease_seconds: float = 1.0, extra: Iterable[str] = ()) -> None:
        self.name = name
        self.etcd = etcd
        self.lease_seconds = lease_seconds
        self.network = Network()
        self.etcd_proxy_port = self.network.proxy("etcd", etcd.port)
        self.nodes = [Node(f"n{i + 1}", os.path.join(directory, f"n{i + 1}"), cluster=name,
                           coordinator=etcd.coordinator(self.etcd_proxy_port), network=self.network,
                           sync_replicas=sync_replicas, lease_seconds=lease_seconds, extra=extra)
                      for i in range(size)]

    def start(self) -> Cluster:
        try:
            for node in self.nodes:
                node.launch()
            for node in self.nodes:
                node.wait_listening()
        except BaseException:
            self.close()
            raise
        return self

    def node(self, url: str | None) -> Node | None:
        """The node that advertises (or listens at) ``url``."""
        url = (url or "").rstrip("/")
        return next((n for n in self.nodes if url in (n.advertise, n.direct)), None)

    def statuses(self) -> dict[str, dict[str, Any] | None]:
        return {node.name: node.status() for node in self.nodes}

    def leader(self, among: list[Node] | None = None, *, agreed: bool = True) -> tuple[Node, int] | None:
        """The node of ``among`` (default: all) that says it leads, with its
        epoch (the newest, if several say so); when ``agreed``, only once every
        other answering node of ``among`` names it too."""
        nodes = self.nodes if among is None else among
        answers = [s for s in (n.status() for n in nodes) if s is not None]
        leaders = [s for s in answers if s.get("role") == "leader"]
        if not leaders:
            return None
        newest = max(leaders, key=lambda s: s.get("epoch", 0))
        node = self.node(newest.get("node"))
        if node is None or (agreed and any(s.get("leader") != newest["node"] for s in answers)):
            return None
        return node, int(newest["epoch"])

    def wait_for_leader(self, *, newer_than: int = 0, among: list[Node] | None = None, agreed: bool = True,
                        timeout: float = 60.0) -> tuple[Node, int]:
        """A leader (:meth:`leader`) with an epoch above ``newer_than``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.leader(among, agreed=agreed)
            if found is not None and found[1] > newer_than:
                return found
            time.sleep(POLL)
        raise AssertionError(f"no leader with an epoch above {newer_than} within {timeout:.0f} s: "
                             f"{self.statuses()}\n{self.logs()}")

    def wait_followed(self, timeout: float = 60.0) -> tuple[Node, int]:
        """Until every running node follows one leader, has applied what the
        leader had made durable when the wait began (each replica caught up
        once), answers reads, and is among the leader's members. A newer leader elected
        meanwhile (a lease lost on a loaded machine is a failover like any
        other) is waited for in its place."""
        deadline = time.monotonic() + timeout
        leader, epoch = self.wait_for_leader(timeout=timeout)
        target = int((leader.status() or {}).get("durable_lsn", 0))
        while time.monotonic() < deadline:
            running = [n for n in self.nodes if n.alive() and not n.paused]
            answers = {n.advertise: n.status() for n in running}
            members = {m.get("url") for m in (answers.get(leader.advertise) or {}).get("members", [])}
            if all(s is not None and s.get("leader") == leader.advertise and s.get("epoch") == epoch
                   and int(s.get("applied_lsn", 0)) >= target and s.get("reads") for s in answers.values()) \
                    and members | {leader.advertise} >= set(answers):
                return leader, epoch
            newer = [s for s in answers.values() if s is not None and s.get("role") == "leader"
                     and int(s.get("epoch", 0)) > epoch]
            if newer:
                found = self.node(max(newer, key=lambda s: int(s.get("epoch", 0))).get("node"))
                if found is not None:
                    leader, epoch = found, max(int(s.get("epoch", 0)) for s in newer)
                    target = int((leader.status() or {}).get("durable_lsn", 0))
            time.sleep(POLL)
        raise AssertionError(f"not every node follows {leader.name} (epoch {epoch}) up to LSN {target} "
                             f"within {timeout:.0f} s: {self.statuses()}\n{self.logs()}")

    def replicas(self, leader: Node) -> list[Node]:
        return [n for n in self.nodes if n is not leader]

    def logs(self, lines: int = 20) -> str:
        """The end of every node's stderr, and the network's state, for failure messages."""
        nodes = "\n".join(f"--- {n.name} ({n.advertise}) stderr (end) ---\n{n.log_tail(lines)}" for n in self.nodes)
        return f"{nodes}\n--- network: {self.network.report()}"

    def stop(self) -> dict[str, int | None]:
        """SIGTERM every node (each its exit code), so that their logs can be read."""
        return {node.name: node.stop() for node in self.nodes}

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        self.network.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


