"""``walkv serve`` killed, stopped and starved, black-box:

* SIGKILL while 64 concurrent clients write (puts and batches): after the
  store is reopened, every write that got a 2xx is there with its value, in
  the log entry at the LSN the answer named, each client's writes in the
  order it made them;
* SIGTERM while requests are in flight: a request the server had started
  (its ``100 Continue`` was seen) completes with a 2xx after the signal; the
  other writers get a 2xx or no answer at all (never a 5xx from a
  half-closed store); an open watch stream does not hold the exit up; the
  process exits 0 and the store was closed cleanly (its SESSION record says
  so: the next open replays nothing it did not have to);
* slow clients (headers sent a byte at a time, a connection that never sends
  anything, a watch stream that is never read) do not stop other clients from
  being served, and the server's timeouts close them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import signal
import socket
import threading
from collections import defaultdict
from collections.abc import Callable

import httpx
import pytest

import kvstore
import wal
from kvstore.entry.codec import decode
from kvstore.store.recovery import read_session
from tests.server_fixture import ServedStore, seed_store

pytestmark = pytest.mark.crash

CLIENTS = 64


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def log_entries(store: str) -> dict[int, list[list]]:
    """LSN -> the decoded ops of its entry, read from the log files directly."""
    out: dict[int, list[list]] = {}
    with wal.open(os.path.join(store, "wal")) as lg:
        for lsn, payload in lg.read(lg.first_lsn):
            out[lsn] = decode(payload, lsn)
    return out


class Writers:
    """``n`` asyncio clients, each on its own connection, writing its own keys
    until told to stop or until the server goes away; ``acked`` keeps, per
    client, ``(lsn, {key: value})`` of every write answered 2xx, in order."""

    def __init__(self, server: ServedStore, n: int, *, value_bytes: int = 64) -> None:
        self.server = server
        self.n = n
        self.value_bytes = value_bytes
        self.acked: dict[int, list[tuple[int, dict[bytes, bytes]]]] = defaultdict(list)
        self.refused: list[str] = []   # transport errors: no answer (the server was gone or going)
        self.answers: list[tuple[int, str]] = []  # non-2xx answers
        self.count = 0

    async def one(self, c: int, enough: asyncio.Event, target: int, stop: asyncio.Event) -> None:
        rnd = random.Random(c)
        async with self.server.async_client(timeout=60) as client:
            i = 0
            while not stop.is_set():
                i += 1
                pad = bytes(rnd.getrandbits(8) for _ in range(self.value_bytes))
                if i % 4 == 0:
                    writes = {b"c%02d-%06d-%d" % (c, i, j): b"%d:" % j + pad for j in range(3)}
                    req = client.post("/v1/batch", json={"ops": [
                        {"op": "put", "key": b64(k), "value": b64(v)} for k, v in writes.items()]})
                else:
                    writes = {b"c%02d-%06d" % (c, i): pad}
                    (key, value), = writes.items()
                    req = client.put("/v1/kv/" + key.decode(), content=value)
                try:
                    resp = await req
                except httpx.TransportError as exc:
                    self.refused.append(type(exc).__name__)
                    return
                if resp.status_code // 100 != 2:
                    self.answers.append((resp.status_code, resp.text))
                    return
                self.acked[c].append((resp.json()["lsn"], writes))
                self.count += 1
                if self.count >= target:
                    enough.set()

    async def run(self, target: int, action: Callable[[], None]) -> None:
        """Write until ``target`` writes were acknowledged, call ``action()``
        (the signal), and go on until every client got no answer."""
        enough, stop = asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(self.one(c, enough, target, stop)) for c in range(self.n)]
        await enough.wait()
        await asyncio.get_running_loop().run_in_executor(None, action)
        await asyncio.gather(*tasks)

    def check_in(self, store: str) -> int:
        """Every acknowledged write is in the reopened store with its value, in
        the log entry at its LSN; each client's LSNs increase. Returns how many."""
        entries = log_entries(store)
        n = 0
        with kvstore.open(store) as db:
            for c, writes in self.acked.items():
                lsns = [lsn for lsn, _ in writes]
                assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns), f"client {c}: LSNs out of order {lsns}"
                for lsn, kv in writes:
                    assert lsn in entries, f"acknowledged LSN {lsn} is not in the log"
                    puts = {op[1]: op[2] for op in entries[lsn] if op[0] == 1}
                    for key, value in kv.items():
                        assert puts.get(key) == value, f"LSN {lsn} does not hold {key!r}"
                        assert db.get(key) == value, f"acknowledged {key!r} (LSN {lsn}) is lost"
                        n += 1
                assert db.last_lsn >= max(lsns, default=0)
        return n


def test_sigkill_under_64_writing_clients_loses_no_acknowledged_write(tmp_path):
    store = str(tmp_path / "store")
    seed_store(store, keys=1)
    with ServedStore(store, args=("--sync", "always")) as server:
        writers = Writers(server, CLIENTS)
        asyncio.run(writers.run(target=500, action=server.kill))
        assert server.proc.returncode == -9
    assert writers.count >= 500
    assert not writers.answers, writers.answers[:5]  # SIGKILL: no answer at all, never an error answer
    assert writers.check_in(store) >= 500


def _session_clean(store: str) -> bool:
    session = read_session(os.path.join(store, "lmdb"))
    return bool(session and session["clean"])


def sigterm(server: ServedStore) -> None:
    """SIGTERM, and return once the signal is handled: the port refuses new
    connections (the first thing the server does on it)."""
    server.proc.send_signal(signal.SIGTERM)
    while True:
        try:
            socket.create_connection((server.host, server.port), timeout=5).close()
        except OSError:
            return
        threading.Event().wait(0.01)


def test_sigterm_drains_writers_and_streams_and_closes_the_store_cleanly(tmp_path):
    """16 clients writing and a watch stream open when SIGTERM arrives: every
    write gets a 2xx (and is in the store), a 503, or no answer (it never
    started); the stream ends; the process exits 0 and the store was closed
    cleanly."""
    store = str(tmp_path / "store")
    seed_store(store, keys=1)
    with ServedStore(store) as server:
        watcher = server.client(timeout=30)
        with watcher.stream("GET", "/v1/watch", params={"from_lsn": "1"}) as resp:
            assert resp.status_code == 200
            writers = Writers(server, 16)
            asyncio.run(writers.run(target=200, action=lambda: sigterm(server)))
            code = server.proc.wait(60)
        watcher.close()
        server.stop()
        assert code == 0, server.output()
        assert "Traceback" not in server.output(), server.output()
    assert not [a for a in writers.answers if a[0] != 503], writers.answers[:5]
    assert _session_clean(store), read_session(os.path.join(store, "lmdb"))
    assert writers.check_in(store) >= 200


def test_sigterm_completes_a_request_whose_body_is_still_arriving(tmp_path):
    """A request the server has started (it answered ``100 Continue`` to its
    headers) when SIGTERM arrives completes: its body, sent after the
    signal, is read, the write is answered 200 (``Connection: close``) and
    is in the store. The shutdown timeout is long (60 s): on a slow
    machine too, the body arrives well within it."""
    store = str(tmp_path / "store")
    seed_store(store, keys=1)
    with ServedStore(store, args=("--shutdown-timeout", "60")) as server:
        started = socket.create_connection((server.host, server.port), timeout=30)
        body = b"sent after SIGTERM"
        started.sendall(b"PUT /v1/kv/in-flight HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body))
        assert started.recv(64).startswith(b"HTTP/1.1 100"), "no 100 Continue"
        sigterm(server)
        started.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = started.recv(4096)
            if not chunk:
                break
            answer += chunk
        assert started.recv(4096) == b"", "the connection stayed open after the answer"
        started.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b"connection: close" in answer.split(b"\r\n\r\n", 1)[0].lower(), answer
        assert server.proc.wait(60) == 0, server.output()
        lsn = json.loads(answer.split(b"\r\n\r\n", 1)[1])["lsn"]
    assert _session_clean(store)
    with kvstore.open(store) as db:
        assert db.get(b"in-flight") == body
        assert db.last_lsn >= lsn


def eventually(condition: Callable[[], bool], tries: int = 200) -> bool:
    """Whether ``condition()`` becomes true within ``tries`` attempts 50 ms
    apart (for what the server notices asynchronously: a closed connection)."""
    for _ in range(tries):
        if condition():
            return True
        threading.Event().wait(0.05)
    return False


# -- slow clients --------------------------------------------------------------------------------


class Dribbler(threading.Thread):
    """A connection that sends a request's headers a byte at a time and never
    finishes them; ``closed`` is set once the server closed the connection
    (or answered it with an error) while the client was still dribbling."""

    def __init__(self, host: str, port: int, pause: float) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection((host, port), timeout=60)
        self.pause = pause
        self.closed = threading.Event()
        self.stop = threading.Event()
        self.answer = b""

    def run(self) -> None:
        head = b"GET /v1/kv/k00 HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"s" * 100_000
        self.sock.setblocking(True)
        for byte in head:
            if self.stop.wait(self.pause):
                break
            try:
                self.sock.sendall(bytes([byte]))
            except OSError:
                self.closed.set()
                break
            self.sock.settimeout(0.0)
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            self.sock.settimeout(60)
            if data is not None:  # an answer, or the end of the connection
                self.answer += data
                self.closed.set()
                break
        self.sock.close()


def test_slow_header_senders_do_not_stop_others_and_are_timed_out(tmp_path):
    store = str(tmp_path / "store")
    seed_store(store, keys=2)
    with ServedStore(store, args=("--idle-timeout", "2")) as server:
        dribblers = [Dribbler(server.host, server.port, pause=0.05) for _ in range(20)]
        silent = [socket.create_connection((server.host, server.port), timeout=60) for _ in range(20)]
        for d in dribblers:
            d.start()
        with server.client() as c:
            for i in range(50):
                assert c.put(f"/v1/kv/other-{i}", content=b"v").status_code == 200
                assert c.get("/v1/kv/k01").content == b"value 1"
        for d in dribblers:
            assert d.closed.wait(60), "a connection dribbling its headers was never closed"
        for s in silent:
            s.recv(4096)  # returns (b"" or an error answer) once the server closes it; 60 s without fails
            s.close()
        for d in dribblers:
            d.stop.set()
            d.join(10)
        with server.client() as c:
            assert c.get("/v1/kv/other-49").content == b"v"
        assert server.stop() == 0


def test_a_watch_stream_never_read_does_not_stop_others_and_is_dropped(tmp_path):
    """A watcher that never reads (its buffers full: the server's writes to
    it block) does not hold up the writers or the other watchers, and the
    server drops it after --idle-timeout: seen as its stream slot coming
    back (--max-streams 2), since a client that does not read cannot see
    the close (the FIN waits behind the unread bytes)."""
    store = str(tmp_path / "store")
    seed_store(store, keys=1)
    with ServedStore(store, args=("--idle-timeout", "2", "--max-streams", "2")) as server:
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect((server.host, server.port))
        stuck.sendall(b"GET /v1/watch?from_lsn=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        big = b"w" * (64 << 10)
        with server.client() as c, server.client() as d:
            for i in range(40):  # 10 MiB of changes (13 as base64), more than any socket buffers
                r = c.post("/v1/batch", json={"ops": [{"op": "put", "key": b64(b"big-%d-%d" % (i, j)),
                                                        "value": b64(big)} for j in range(4)]})
                assert r.status_code == 200, r.text
            last = r.json()["lsn"]
            # Another watcher gets every change up to the last one.
            seen = 0
            with c.stream("GET", "/v1/watch", params={"from_lsn": "1", "format": "ndjson"}) as resp:
                assert resp.status_code == 200
                for line in resp.iter_lines():
                    event = json.loads(line) if line else {}
                    if event.get("op") not in (None, "progress") and base64.b64decode(event["key"]).startswith(b"big-"):
                        assert base64.b64decode(event["value"]) == big
                        seen += 1
                    if seen == 40 * 4 or event.get("lsn", 0) > last:
                        break
            assert seen == 40 * 4
            assert c.get("/v1/kv/big-39-3").content == big

            def two_streams_served() -> bool:
                with c.stream("GET", "/v1/watch") as s1, d.stream("GET", "/v1/watch") as s2:
                    return (s1.status_code, s2.status_code) == (200, 200)
            assert eventually(two_streams_served, tries=600), "the stuck watcher still holds its stream slot"
        stuck.close()
        assert server.stop() == 0


def test_the_caps_on_streams_and_connections_answer_429_and_free_up(tmp_path):
    """``--max-streams``: one stream more is 429 TooManyStreams (JSON), and a
    slot frees when a stream ends; ``--max-connections``: one connection more
    is answered 429 and closed, while the connections inside the cap are
    served."""
    store = str(tmp_path / "store")
    seed_store(store, keys=1)
    with ServedStore(store, args=("--max-streams", "2", "--max-connections", "6")) as server:
        with server.client() as a, server.client() as b, server.client() as c:
            last = c.get("/v1/log/bounds").json()["last_lsn"]
            ndjson = {"from_lsn": "1", "format": "ndjson"}
            with a.stream("GET", "/v1/watch", params=ndjson) as s1, b.stream("GET", "/v1/watch", params=ndjson) as s2:
                assert (s1.status_code, s2.status_code) == (200, 200)
                r = c.get("/v1/watch", params={"from_lsn": "1"})
                assert r.status_code == 429 and r.json()["error"]["type"] == "TooManyStreams", r.text
                assert c.get("/v1/kv/k00").content == b"value 0"  # plain requests still served
                for stream in (s1, s2):  # read the backlog: both streams are idle now, waiting for changes
                    for line in stream.iter_lines():
                        if line and json.loads(line)["lsn"] >= last:
                            break
            # Both clients went away: a new stream gets a slot (once the server saw them leave).

            def stream_served() -> bool:
                with c.stream("GET", "/v1/watch", params={"from_lsn": "1"}) as s3:
                    return s3.status_code == 200
            assert eventually(stream_served), "the slots of streams whose clients left never freed"
        held = []
        for _ in range(6):  # the cap's worth of idle connections, each proven served
            sock = socket.create_connection((server.host, server.port), timeout=30)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            held.append(sock)
        with socket.create_connection((server.host, server.port), timeout=30) as extra:
            answer = b""
            while chunk := extra.recv(4096):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429"), answer
        assert json.loads(body)["error"]["type"] == "TooManyStreams"
        held.pop().close()

        def connection_served() -> bool:
            with socket.create_connection((server.host, server.port), timeout=30) as again:
                again.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return again.recv(4096).startswith(b"HTTP/1.1 200")
        assert eventually(connection_served), "a connection slot never freed"
        for sock in held:
            sock.close()
        assert server.stop() == 0
