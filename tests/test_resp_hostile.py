"""Hostile and slow clients of the RESP face: malformed frames, generated
with hypothesis, each get an error and a closed connection and leave the
store's files as they were; a client that never reads its answers, and a
MULTI that never EXECs, hold up nobody else."""

from __future__ import annotations

import hashlib
import os
import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.resp_fixture import InProcess

redis = pytest.importorskip("redis")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = InProcess(str(tmp_path_factory.mktemp("hostile") / "store"))
    s.store.put(b"seed", b"v")
    yield s
    s.close()


def files_digest(path: str) -> str:
    """Every file of the store's log directory, by name and content."""
    h = hashlib.sha256()
    wal = os.path.join(path, "wal")
    for name in sorted(os.listdir(wal)):
        h.update(name.encode())
        with open(os.path.join(wal, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def exchange(port: int, frame: bytes) -> bytes:
    """Send ``frame``, read until the server closes (or 5 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(frame)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return got


def _bulk(b: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(b), b)


# Frames no valid command can be: a type byte other than '*', an array whose
# elements are not strings, bad lengths, a null array, nesting; each
# after a valid write, which must not be undone, and followed by one, which
# must not run.
BAD = st.one_of(
    # (not a length-prefixed type: one of those waits for its bytes, as Redis would)
    st.binary(min_size=1, max_size=40).filter(lambda b: b[:1] not in b"*$%~>|=!").map(lambda b: b + b"\r\n"),
    st.sampled_from([b"*-5\r\n", b"*x\r\n", b"*1\r\n:1\r\n", b"*2\r\n$3\r\nSET\r\n*0\r\n",
                     b"*1\r\n$-1\r\n", b"*-1\r\n", b"*0\r\n", b"$3\r\nGET\r\n", b"*1\r\n$2\r\nabc\r\n",
                     b"*1\r\n$x\r\n", b"*2\r\n$3\r\nSET\r\n%1\r\n$1\r\na\r\n$1\r\nb\r\n", b"*1\r\n_\r\n",
                     b"*1\r\n$3\r\nGET\r\n\r\n\r\n:", b"*99999999999999999999\r\n"]),
    st.tuples(st.integers(-5, 5), st.sampled_from([b":%d", b"#t", b",%d.5", b"_"])).map(
        lambda t: b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n" + (t[1] % t[0] if b"%" in t[1] else t[1]) + b"\r\n"),
)


def test_malformed_frames_get_an_error_and_change_no_file(server):
    path = server.store.path
    server.store.sync()
    before = (server.store.last_lsn, files_digest(path))

    @settings(max_examples=80, deadline=None)
    @given(BAD)
    def check(frame):
        got = exchange(server.port, frame + b"*3\r\n$3\r\nSET\r\n$5\r\nafter\r\n$1\r\nx\r\n")
        assert b"-ERR Protocol error" in got, (frame, got)
        assert not got.endswith(b"+OK\r\n"), "the command after a bad frame ran"

    check()
    assert server.store.get(b"after") is None and server.store.get(b"seed") == b"v"
    assert (server.store.last_lsn, files_digest(path)) == before


def test_a_request_over_the_limit_is_refused_before_auth_too(tmp_path):
    from kvstore.server.auth import Tokens

    s = InProcess(str(tmp_path / "s"), tokens=Tokens([("write", "w")]))
    try:
        got = exchange(s.port, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100000\r\n" + b"x" * 40_000)
        assert got.startswith(b"-ERR Protocol error") and s.store.last_lsn == 0
    finally:
        s.close()


def test_a_client_that_never_reads_holds_up_nobody(server):
    server.store.put(b"big", b"x" * 1_000_000)
    slow = socket.create_connection(("127.0.0.1", server.port))
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sendall(b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n" * 200)  # ~200 MB of answers it will not read
    time.sleep(0.2)
    c = server.client()
    for n in range(20):
        assert c.set(f"fast{n}", n) and c.get(f"fast{n}") == str(n).encode()
    assert c.info("clients")["connected_clients"] >= 2
    c.close()
    slow.close()


def test_a_multi_that_never_execs_holds_up_nobody(server):
    stuck = server.client()
    stuck.execute_command("MULTI")
    for n in range(100):
        stuck.execute_command("SET", f"queued{n}", "x")  # +QUEUED
    other = server.client()
    assert other.set("queued0", "mine") and other.incr("counter") >= 1
    with other.pipeline() as p:  # others' transactions go on
        p.set("t", "1").incr("t")
        assert p.execute() == [True, 2]
    assert server.store.get(b"queued1") is None
    stuck.close()  # the connection ends: the queue is dropped, nothing written
    time.sleep(0.1)
    assert other.get("queued0") == b"mine" and server.store.get(b"queued1") is None
    other.close()
