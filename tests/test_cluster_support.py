"""The cluster tests' helpers on their own, before (and whatever) the
cluster engine does: etcd started and stopped (tests/cluster_etcd.py), the
proxy's link modes and how it tells sources apart (tests/cluster_proxy.py),
and a node's launcher killing, pausing and restarting a real ``walkv serve``
(tests/cluster_nodes.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from benchmarks.processes import port_open
from tests.cluster_etcd import Etcd, etcd_missing
from tests.cluster_nodes import Node
from tests.cluster_proxy import ANY, BLACKHOLE, CLIENT, PASS, REFUSE, STALL, Network
from tests.server_fixture import serve_command

# -- a peer to proxy to -------------------------------------------------------------------------


class EchoServer:
    """A threaded TCP echo server on loopback, stopped by ``close``."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        # (close alone leaves the thread blocked in accept for good, on Linux: shutdown wakes it)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the echo server's thread did not end"


@pytest.fixture
def echo():
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def network():
    with Network() as net:
        yield net


def roundtrip(port: int, payload: bytes = b"ping", timeout: float = 2.0) -> bytes:
    """Send ``payload`` through ``port``; what comes back (b"" when the
    connection was closed or reset)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(payload)
            return s.recv(65536)
        except ConnectionResetError:
            return b""


def echoing(port: int, timeout: float = 2.0) -> socket.socket:
    """A connection through ``port`` that has echoed one byte (it passes)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(b"a")
    assert s.recv(10) == b"a"
    return s


def closed(s: socket.socket) -> bool:
    """Whether the other end closed or reset ``s`` (rather than sending bytes)."""
    try:
        return s.recv(10) == b""
    except ConnectionResetError:
        return True


def test_a_passing_link_forwards_both_ways(echo, network):
    port = network.proxy("echo", echo.port)
    assert roundtrip(port, b"hello") == b"hello"
    assert network.accepted[(CLIENT, "echo")] == 1


def test_refuse_resets_new_and_open_connections(echo, network):
    port = network.proxy("echo", echo.port)
    with echoing(port) as open_one:
        network.set(CLIENT, "echo", REFUSE)
        assert closed(open_one)
    assert roundtrip(port) == b""
    network.heal()
    assert roundtrip(port) == b"ping"


def test_blackhole_swallows_and_answers_nothing(echo, network):
    port = network.proxy("echo", echo.port)
    network.set(ANY, "echo", BLACKHOLE)
    with pytest.raises(socket.timeout):
        roundtrip(port, timeout=0.3)
    network.heal()
    assert roundtrip(port) == b"ping"


def test_an_open_connection_that_lost_bytes_is_reset_when_healed(echo, network):
    port = network.proxy("echo", echo.port)
    with echoing(port) as s:
        network.set(CLIENT, "echo", BLACKHOLE)
        s.sendall(b"lost")
        time.sleep(0.2)
        network.heal()
        assert closed(s)  # never the bytes after a hole


def test_stall_holds_bytes_and_delivers_them_when_healed(echo, network):
    port = network.proxy("echo", echo.port)
    with echoing(port, timeout=0.3) as s:
        network.set(CLIENT, "echo", STALL)
        s.sendall(b"held")
        with pytest.raises(socket.timeout):
            s.recv(10)
        network.heal()
        s.settimeout(5)
        assert s.recv(10) == b"held"
    network.set(ANY, "echo", STALL)  # a new connection: accepted, then held
    with socket.create_connection(("127.0.0.1", port), timeout=0.3) as s:
        s.sendall(b"new")
        with pytest.raises(socket.timeout):
            s.recv(10)
        threading.Timer(0.2, network.heal).start()
        s.settimeout(5)
        assert s.recv(10) == b"new"


CHILD = """
import socket, sys, time
time.sleep(0.5)  # the test registers this process meanwhile
try:
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1) as s:
        s.sendall(b"child")
        print(s.recv(10).decode() or "closed")
except OSError as exc:
    print(type(exc).__name__)
"""


def child_through(network: Network, port: int, name: str, mode: str) -> str:
    """What a child process registered as ``name`` gets back through ``port``
    while its links are in ``mode``."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(port)], stdout=subprocess.PIPE, text=True)
    network.register(name, child.pid)
    network.set(name, ANY, mode)
    out, _ = child.communicate(timeout=10)
    return out.strip()


def test_links_are_told_apart_by_the_process_that_opened_them(echo, network):
    port = network.proxy("echo", echo.port)
    assert child_through(network, port, "n1", PASS) == "child"
    assert child_through(network, port, "n1", REFUSE) in ("closed", "ConnectionResetError")
    assert network.accepted[("n1", "echo")] == 2
    assert roundtrip(port) == b"ping"  # the test's own connection passes meanwhile
    assert network.accepted[(CLIENT, "echo")] == 1


def test_isolate_cuts_a_source_both_ways_but_keeps_the_clients(network):
    for name, pid in (("n1", 1), ("n2", 2), ("n3", 3)):
        network.register(name, pid)
    network.isolate("n2", STALL)
    assert network.mode("n2", "etcd") == STALL and network.mode("n2", "n1") == STALL
    assert network.mode("n1", "n2") == STALL and network.mode("n3", "n2") == STALL
    assert network.mode(CLIENT, "n2") == PASS and network.mode("n1", "n3") == PASS
    network.heal()
    assert network.mode("n2", "etcd") == PASS


def test_close_stops_listeners_connections_and_the_thread(echo):
    net = Network()
    port = net.proxy("echo", echo.port)
    with echoing(port) as s:
        net.close()
        assert not port_open(port)
        assert not net._thread.is_alive()
        assert closed(s)


def test_unknown_mode_is_refused(network):
    with pytest.raises(ValueError, match="unknown link mode"):
        network.set(CLIENT, ANY, "sometimes")


# -- etcd -----------------------------------------------------------------------------------


@pytest.mark.skipif(etcd_missing() is not None, reason=str(etcd_missing()))
def test_etcd_starts_answers_and_stops(tmp_path):
    with Etcd(str(tmp_path)) as etcd:
        etcd.put(b"walkv/a", b"1")
        etcd.put(b"walkv/b", b"2")
        etcd.put(b"other", b"3")
        assert etcd.keys(b"walkv/") == {b"walkv/a": b"1", b"walkv/b": b"2"}
        assert etcd.coordinator() == f"etcd://127.0.0.1:{etcd.port}"
        proc = etcd.server.proc
    assert proc.poll() is not None
    assert not port_open(etcd.port)


# -- the node launcher, on a plain walkv serve ----------------------------------------------------


def test_node_launcher_kills_pauses_and_restarts_with_the_same_command(tmp_path):
    with Network() as net:
        node = Node("n1", str(tmp_path / "n1"), cluster="c", coordinator="etcd://127.0.0.1:1", network=net,
                    sync_replicas=1, lease_seconds=1)
        node.argv = serve_command(node.store, "--listen", f"127.0.0.1:{node.listen_port}")  # no cluster yet
        try:
            node.start()
            with httpx.Client(timeout=2) as http:
                assert http.put(node.direct + "/v1/kv/a", content=b"1").status_code == 200
                assert http.get(node.advertise + "/v1/kv/a").content == b"1"  # through its proxy
                node.pause()
                with pytest.raises(httpx.TimeoutException):
                    http.get(node.direct + "/v1/kv/a", timeout=0.5)
                node.resume()
                assert http.get(node.direct + "/v1/kv/a").content == b"1"
                node.kill()
                assert not node.alive()
                node.start()
                assert http.get(node.direct + "/v1/kv/a").content == b"1"
            assert node.stderr().count("=== n1 start ") == 2
            assert node.stop() == 0
        finally:
            node.close()


def test_close_ends_stalled_connections_too(echo):
    net = Network()
    port = net.proxy("echo", echo.port)
    net.set(ANY, "echo", STALL)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as waiting, \
            socket.create_connection(("127.0.0.1", port), timeout=2) as sending:
        sending.sendall(b"held")
        time.sleep(0.1)
        net.close()
        assert not net._thread.is_alive()
        assert closed(waiting) and closed(sending)


def test_refusing_one_stalled_link_leaves_the_others_stalled(echo, network):
    a, b = network.proxy("a", echo.port), network.proxy("b", echo.port)
    network.set(ANY, "a", STALL)
    network.set(ANY, "b", STALL)
    with socket.create_connection(("127.0.0.1", a), timeout=2) as to_a, \
            socket.create_connection(("127.0.0.1", b), timeout=5) as to_b:
        to_a.sendall(b"x")
        to_b.sendall(b"kept")
        time.sleep(0.1)
        network.set(CLIENT, "a", REFUSE)
        assert closed(to_a)
        network.heal()
        assert to_b.recv(10) == b"kept"
