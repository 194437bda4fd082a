"""The servers of :mod:`benchmarks.server`, started and stopped by the
benchmark itself: each on a free loopback port, with its data in a fresh
directory, durable on every acknowledged write, its output in a log file
there.

* walkv: ``walkv serve STORE --listen 127.0.0.1:0`` (``sync="always"``: a 2xx
  answer to a put means its log entry is fsynced; the writes of all
  connections share group commit). Ready when it prints ``listening on``.
* etcd (``etcd`` from the ``etcd-server`` package, 3.4): one member, its own
  data dir; every put is in its fsynced WAL before it is answered. Reached
  through its HTTP JSON gateway (``/v3/kv/...``) on the client port. Ready
  when ``/health`` says so.
* Redis (``redis-server``, 7): ``appendonly yes``, ``appendfsync always`` (the
  append-only file is fsynced before replies go out), no RDB snapshots.
  Ready when it answers PING.

:func:`missing_peers` names the programs that are not installed (the
benchmark says so instead of failing).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Callable

from benchmarks import processes
from benchmarks.processes import free_port
from benchmarks.timing import REPO

START_TIMEOUT = 30.0
PROGRAMS = {"etcd": "etcd", "redis": "redis-server"}
INSTALL_HINT = "apt-get install -y etcd-server redis-server"


def missing_peers() -> dict[str, str]:
    """``{peer: why}`` for each peer whose program is not on PATH."""
    return {peer: f"{prog} not found on PATH ({INSTALL_HINT})"
            for peer, prog in PROGRAMS.items() if shutil.which(prog) is None}


@dataclass
class Server:
    """A running server process: ``url`` to reach it, ``stop()`` to end it."""

    name: str
    url: str
    proc: subprocess.Popen
    log_path: str

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; wait for the process."""
        processes.stop(self.proc)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server process has used so far (Linux /proc)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-3:])
        except OSError:
            return "(no log)"


def _wait_ready(server: Server, ready: Callable[[], bool]) -> Server:
    processes.wait_ready(server.proc, ready, server.name, timeout=START_TIMEOUT, log_tail=server.log_tail)
    return server


def start_walkv(directory: str, *extra: str, listen: str = "127.0.0.1:0") -> Server:
    """``walkv serve`` on the store ``directory/store`` (new, or the one a
    previous start left: a restart), listening at ``listen`` (``extra``:
    more options); its stderr appended to ``directory/walkv-serve.log``."""
    store = os.path.join(directory, "store")
    log_path = os.path.join(directory, "walkv-serve.log")
    env = dict(os.environ, PYTHONPATH=REPO + (os.pathsep + os.environ["PYTHONPATH"]
                                              if os.environ.get("PYTHONPATH") else ""))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kvstore.cli", "serve", store, "--listen", listen,
                                 *extra], stdout=subprocess.PIPE, stderr=log, env=env, cwd=REPO)
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT
    server = Server("walkv", "", proc, log_path)
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode(errors="replace")
        if not line:
            server.check_alive()
            raise RuntimeError(f"walkv serve closed its stdout: {server.log_tail()}")
        if "listening on " in line:
            server.url = line.split("listening on ", 1)[1].split()[0].rstrip("/")
            return server
    server.stop()
    raise RuntimeError(f"walkv serve did not say it was listening within {START_TIMEOUT:.0f} s")


def start_etcd(directory: str) -> Server:
    """One etcd member with its data in ``directory`` (module docstring)."""
    return start_etcd_members(directory, 1)[0]


def start_etcd_members(directory: str, members: int, *, heartbeat_ms: int = 100,
                       election_ms: int = 1000) -> list[Server]:
    """``members`` etcd members forming one cluster on free loopback ports,
    member ``i``'s data in ``directory/etcd-data[-i]``; returned once every
    member's ``/health`` says so (a quorum elected a leader). etcd's Raft
    timings are its defaults unless given (shorter ones also lower the
    shortest lease it grants: about 1.5 election timeouts)."""
    ports = [(free_port(), free_port()) for _ in range(members)]
    names = ["bench"] if members == 1 else [f"bench{i}" for i in range(members)]
    cluster = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, (_, peer) in zip(names, ports))
    servers = []
    try:
        for name, (client, peer) in zip(names, ports):
            suffix = "" if members == 1 else f"-{name}"
            log_path = os.path.join(directory, f"etcd{suffix}.log")
            client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    ["etcd", "--name", name, "--data-dir", os.path.join(directory, f"etcd-data{suffix}"),
                     "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                     "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                     "--initial-cluster", cluster, "--heartbeat-interval", str(heartbeat_ms),
                     "--election-timeout", str(election_ms), "--logger", "zap", "--log-level", "error"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            servers.append(Server("etcd" + suffix, client_url, proc, log_path))
        for server in servers:
            def ready(url: str = server.url) -> bool:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    return b'"true"' in resp.read()

            _wait_ready(server, ready)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def start_redis(directory: str) -> Server:
    """One Redis server, append-only file fsynced at every write (module docstring)."""
    port = free_port()
    log_path = os.path.join(directory, "redis.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", directory,
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
             "--protected-mode", "yes", "--logfile", ""],
            stdout=log, stderr=subprocess.STDOUT)

    def ready() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")

    return _wait_ready(Server("redis", f"redis://127.0.0.1:{port}", proc, log_path), ready)
