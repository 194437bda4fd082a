"""The HTTP client and server beyond the shared API tests (tests/served.py runs
those): the wire's error table both ways, resuming a change stream, the
asyncio client against the asyncio front, paged scans, ``min_lsn``, the log
endpoints a follower reads, subscriptions, tokens, and ``walkv serve``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import httpx
import pytest

import kvstore
import wal
from kvstore.client import wire
from kvstore.client.events import END, RECONNECTS, Event, EventParser, Reconnecting, Resumption
from kvstore.server import Limits, Tokens, tls_context
from kvstore.server.auth import ADMIN, READ, WRITE
from tests.served import KINDS, ServerThread, open_store_async
from wal.errors import LogGapError, ReplicaLagError, SubscriptionInvalidatedError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the wire ---------------------------------------------------------------------

@pytest.mark.parametrize("exc, status", [
    (LogGapError("gone", first_missing=1, last_missing=9, first_available=10), 410),
    (SubscriptionInvalidatedError("over", name="s", next_lsn=4), 410),
    (ReplicaLagError("late", applied_lsn=3, target_lsn=7), 503),
    (kvstore.RecordTooLargeError("big"), 413), (kvstore.ReadOnlyError("ro"), 409),
    (kvstore.DiskFullError("full"), 503), (kvstore.ClosedError("closed"), 503),
    (ValueError("bad"), 400), (TypeError("type"), 400), (wire.BadRequest("json"), 400),
    (wire.Unauthorized("who"), 401), (wire.Forbidden("no"), 403), (wire.NotFound("none"), 404),
    (wire.TooManyStreams("many"), 429), (wire.PayloadTooLarge("body"), 413),
])
def test_errors_cross_the_wire_as_the_same_class_with_their_fields(exc, status) -> None:
    got_status, body = wire.error_body(exc)
    assert got_status == status
    with pytest.raises(type(exc)) as raised:
        wire.raise_for_error(got_status, json.dumps(body).encode())
    assert type(raised.value) is type(exc) and str(raised.value) == str(exc)
    public = {k: v for k, v in vars(exc).items() if not k.startswith("_")}
    assert {k: getattr(raised.value, k) for k in public} == public


def test_a_bug_is_a_500_that_shows_no_detail() -> None:
    status, body = wire.error_body(KeyError("secret/path/token"))
    assert status == 500 and body["error"]["type"] == "InternalError"
    assert "secret" not in body["error"]["message"] and "bug" in body["error"]["message"]
    with pytest.raises(wire.InternalError):
        wire.raise_for_error(500, b"oops")
    with pytest.raises(wire.ServerUnavailable, match="not a walkv error answer"):
        wire.raise_for_error(502, b"<html>bad gateway</html>")


def test_a_type_that_disagrees_with_its_status_is_not_trusted() -> None:
    with pytest.raises(wire.Forbidden):  # a 403 claiming to be a LogGapError is a 403
        wire.raise_for_error(403, b'{"error": {"type": "LogGapError", "message": "x"}}')


# -- resuming a stream ------------------------------------------------------------------

def _events(text: str) -> list[Event]:
    parser = EventParser()
    return [e for line in text.split("\n") if (e := parser.feed(line)) is not None]


def _change(lsn: int, index: int, key: bytes) -> str:
    doc = {"lsn": lsn, "op": "upsert", "key": wire.b64encode(key), "value": "", "end_key": None, "time": 1,
           "index": index}
    return f"id: {lsn}\ndata: {json.dumps(doc)}\n\n"


def test_a_resumed_stream_skips_what_was_delivered_and_loses_nothing() -> None:
    pos = Resumption(5, {"prefix": b"a"})
    first = _events(_change(5, 0, b"a1") + _change(6, 0, b"a2") + _change(6, 1, b"a3"))
    assert [pos.handle(e).key for e in first] == [b"a1", b"a2", b"a3"]  # type: ignore[union-attr]
    assert pos.params() == {"prefix": b"a", "from_lsn": 6}  # the batch of LSN 6 again, whole
    again = _events(_change(6, 0, b"a2") + _change(6, 1, b"a3") + _change(6, 2, b"a4") + _change(7, 0, b"a5"))
    assert [c.key for e in again if (c := pos.handle(e)) is not None] == [b"a4", b"a5"]  # type: ignore[union-attr]
    assert pos.handle(_events('event: progress\ndata: {"lsn": 9}\n\n')[0]).op == "progress"  # type: ignore
    assert pos.params()["from_lsn"] == 10
    assert pos.handle(_events("event: end\ndata: {}\n\n")[0]) is END
    gap = wire.error_body(LogGapError("gone", first_missing=1, last_missing=2, first_available=3))[1]
    with pytest.raises(LogGapError) as e:
        pos.handle(Event("gap", json.dumps(gap)))
    assert e.value.first_available == 3


def test_reconnecting_gives_up_only_after_connections_in_a_row_that_deliver_nothing() -> None:
    stream = Reconnecting("http://x", Resumption(1, {}))
    broke = wire.ServerUnavailable("broke")
    for lsn in range(1, RECONNECTS + 3):  # each connection delivers a change before it breaks: never gives up
        assert stream.connect()["from_lsn"] == max(lsn - 1, 1)
        changes = [c for line in _change(lsn, 0, b"k").split("\n") if (c := stream.line(line)) is not None]
        assert [(c.lsn, c.key) for c in changes] == [(lsn, b"k")]
        assert stream.broken(broke) > 0
    for _ in range(RECONNECTS - 1):  # connections that deliver nothing: the last one gives up
        stream.connect()
        assert stream.broken(broke) > 0
    stream.connect()
    with pytest.raises(wire.ServerUnavailable, match="broke"):
        stream.broken(broke)
    ending = Reconnecting("http://x", Resumption(1, {}))
    for _ in range(RECONNECTS - 1):
        assert ending.ended() > 0
    with pytest.raises(wire.ServerUnavailable, match="kept ending"):
        ending.ended()
    done = Reconnecting("http://x", Resumption(1, {}))
    assert [done.line(line) for line in ("event: end", "data: {}", "")] == [None, None, None] and done.finished
    assert not done.running(False) and done.after(None, False) == 0.0  # the server ended it: no next connection
    closed = Reconnecting("http://x", Resumption(1, {}))
    for _ in range(RECONNECTS + 1):  # a closed watcher neither gives up with an error nor waits
        assert closed.after(broke, True) == 0.0 and not closed.running(True)
    assert closed.running(False) and closed.after(broke, False) > 0


def test_a_watch_goes_on_after_the_server_restarts(tmp_path) -> None:
    """Stopping the server ends its streams; the client reconnects to a
    server of the same store at the same address and goes on where it
    stopped: the batch it was in is not delivered twice, nothing is lost."""
    store = str(tmp_path / "s")
    first = ServerThread(store)
    port = int(first.url.rsplit(":", 1)[1])
    with kvstore.connect(first.url) as db:
        with db.batch() as b:
            b.put(b"a1", b"1"); b.put(b"a2", b"2")
        w = db.watch(from_lsn=1)
        assert next(w).key == b"a1"
        first.stop()
        with ServerThread(store, port=port):
            db.put(b"a3", b"3")
            assert [next(w).key, next(w).key] == [b"a2", b"a3"]
            w.close()


# -- the asyncio client ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_async_api_against_the_front_and_the_client(tmp_path, kind) -> None:
    async def main() -> None:
        async with open_store_async(kind, tmp_path / "s") as adb:
            assert await adb.put(b"a", b"1") == 1
            assert await adb.get(b"a") == b"1" and await adb.get(b"zz", b"d") == b"d"
            assert await adb.delete(b"a") == 2 and await adb.get(b"a") is None
            await adb.put(b"b", b"2")
            await adb.put(b"c", b"3")
            assert await adb.delete_range(b"b", b"c") == 5
            async with adb.batch() as b:
                b.put(b"x", b"1")
                b.delete(b"c")
            assert b.lsn == 6
            with pytest.raises(RuntimeError):
                async with adb.batch() as b:
                    b.put(b"never", b"1")
                    raise RuntimeError
            assert await adb.get_many([b"x", b"never"]) == [b"1", None]
            async with adb.transaction() as t:
                t.require(b"x", equals=b"1")
                t.require(b"y", absent=True)
                t.put(b"y", b"2")
            assert t.succeeded and t.lsn == 7
            async with adb.transaction() as t:
                t.require(b"x", present=True)
                t.require(b"y", absent=True)
                t.put(b"z", b"3")
            assert t.succeeded is False and t.failed_index == 1 and t.lsn == 8
            assert await adb.compare_and_set(b"x", b"1", b"9") and not await adb.compare_and_set(b"x", b"1", b"0")
            assert await adb.delete_if(b"x", b"9") and await adb.get(b"x") is None
            with pytest.raises(TypeError):
                await adb.put("k", b"v")
            with pytest.raises(kvstore.RecordTooLargeError):
                await adb.put(b"k" * 600, b"v")
            assert await adb.count() == 1 and await adb.contains(b"y")
            watched = []
            async with adb.watch(b"y", from_lsn=1, timeout=0.2) as w:
                async for c in w:
                    watched.append((c.lsn, c.key))
            assert watched == [(7, b"y")]
    asyncio.run(main())


# -- reads a client pages or waits for ------------------------------------------------------

def test_paged_scans_in_both_directions_and_min_lsn(tmp_path) -> None:
    with ServerThread(tmp_path / "s") as server, kvstore.connect(server.url) as db:
        keys = [b"p/%02d" % i for i in range(7)] + [b"q", b"p/\xff\x00"]
        db.update((k, k) for k in keys)
        want = sorted(k for k in keys if k.startswith(b"p/"))
        assert [k for k, _ in db.scan(prefix=b"p/", page=2)] == want
        assert [k for k, _ in db.scan(prefix=b"p/", reverse=True, page=3)] == want[::-1]
        assert [k for k, _ in db.scan(b"p/02", b"p/05", page=1)] == want[2:5]
        assert db.get(b"q", min_lsn=1) == b"q"
        many = [b"p/%02d" % (i % 9) for i in range(wire.MAX_GET_MANY + 5)]  # two requests
        assert db.get_many(many) == [k if k in keys else None for k in many]
        r = httpx.get(server.url + "/v1/kv/q", params={"min_lsn": "99", "min_lsn_timeout": "0.05"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "ReplicaLagError"
        assert r.json()["error"]["target_lsn"] == 99
        with pytest.raises(ReplicaLagError):
            db._http.request("POST", "/v1/get_many", json={"keys": [], "min_lsn": 99, "min_lsn_timeout": 0.05})
        for limit in ("0", "10001", "x"):
            assert httpx.get(server.url + "/v1/scan", params={"limit": limit}).status_code == 400


def test_the_log_endpoints_give_a_follower_what_the_log_holds(tmp_path) -> None:
    store = str(tmp_path / "s")
    with ServerThread(store, segment_bytes=1 << 20) as server, kvstore.connect(server.url) as db:
        for i in range(300):
            db.put(b"k%03d" % i, b"v" * 500)
        bounds = db.bounds()
        assert (bounds["first_lsn"], bounds["durable_lsn"], bounds["last_lsn"]) == (1, 300, 300)
        got = db._http.request("GET", "/v1/log/entries", params={"from_lsn": 120, "limit": 5}).json()
        want = list(wal.read_log(os.path.join(store, "wal"), 120, 124))
        assert [(e["lsn"], wire.b64decode(e["payload"])) for e in got["entries"]] == [
            (e.lsn, e.payload) for e in want] and got["next_lsn"] == 125
        r = db._http.request("GET", "/v1/log/segment", params={"from_lsn": 250})
        segment = os.path.join(store, "wal", r.headers["Walkv-Segment"])
        offset = int(r.headers["Walkv-Offset"])
        assert offset % 32768 == 0 and int(r.headers["Walkv-Durable-Lsn"]) == 300
        with open(segment, "rb") as fh:
            fh.seek(offset)
            assert r.content == fh.read(len(r.content))  # the file's bytes, up to the last durable record
        assert os.path.getsize(segment) > offset + len(r.content)  # not the preallocated rest
        for i in range(300, 400):
            db.put(b"k%03d" % i, b"v" * 500)
        active = db._http.request("GET", "/v1/log/segment", params={"from_lsn": 395})
        nxt = db._http.request("GET", "/v1/log/segment", params={"from_lsn": 401, "wait": 0})
        assert (nxt.headers["Walkv-Segment"], nxt.content) == (active.headers["Walkv-Segment"], b"")
        db.put(b"late", b"x")
        nxt = db._http.request("GET", "/v1/log/segment", params={"from_lsn": 401})
        start = int(nxt.headers["Walkv-Offset"])
        # the active segment has no index: from where the last answer ended, not from its start
        assert start > 0 and 0 < len(nxt.content) < 32768 + 600
        follow = [db._http.request("GET", "/v1/log/entries", params={"from_lsn": n, "limit": 50}).json()
                  for n in (301, 351)]
        assert [e["lsn"] for f in follow for e in f["entries"]] == list(range(301, 401))
        db.snapshot()
        listed = db._http.request("GET", "/v1/snapshots").json()["snapshots"]
        assert [s["lsn"] for s in listed] == [401]
        name = listed[0]["files"][0]["name"]
        body = db._http.request("GET", f"/v1/snapshots/401/{name}").content
        assert len(body) == listed[0]["files"][0]["size"]
        for bad in ("../LOCK", "nope"):
            assert httpx.get(f"{server.url}/v1/snapshots/401/{bad}").status_code == 404


def test_subscriptions_over_http(tmp_path) -> None:
    with ServerThread(tmp_path / "s") as server, kvstore.connect(server.url) as db:
        sub = db.subscribe("orders", b"o/", from_lsn=1, timeout=0.2)
        db.put(b"o/1", b"a"); db.put(b"x", b"-"); db.put(b"o/2", b"b")
        assert [(c.lsn, c.key) for c in sub] == [(1, b"o/1"), (3, b"o/2")]
        sub.ack(1)
        assert sub.acked_lsn == 1 and [i.name for i in db.subscriptions()] == ["orders"]
        again = db.subscribe("orders", b"o/", timeout=0.2)
        assert [c.key for c in again] == [b"o/2"]  # after the acknowledged LSN
        assert db.drop_subscription("orders") and not db.drop_subscription("orders")


def test_watch_as_ndjson_and_the_cap_on_streams(tmp_path) -> None:
    with ServerThread(tmp_path / "s", limits=Limits(max_streams=1)) as server, kvstore.connect(server.url) as db:
        db.put(b"a", b"1")
        with httpx.stream("GET", server.url + "/v1/watch", params={"from_lsn": "1", "format": "ndjson"}) as r:
            assert r.headers["content-type"].startswith("application/x-ndjson")
            lines = r.iter_lines()  # held: dropping it would close the stream
            line = next(lines)
            assert json.loads(line)["key"] == wire.b64encode(b"a")
            over = httpx.get(server.url + "/v1/watch")  # the one slot is taken
            assert over.status_code == 429 and over.json()["error"]["type"] == "TooManyStreams"


# -- tokens ---------------------------------------------------------------------------

def test_tokens_file_roles_and_what_each_may_do(tmp_path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# role token\nread r-secret\n\nwrite w-secret  # a comment\nadmin a-secret\n")
    tokens = Tokens.from_file(path)
    assert [tokens.role_of(f"Bearer {t}") for t in ("r-secret", "w-secret", "a-secret", "nope")] == [
        READ, WRITE, ADMIN, None]
    assert "secret" not in repr(tokens)
    (tmp_path / "bad").write_text("reader x-secret\n")
    with pytest.raises(ValueError, match="line 1") as e:
        Tokens.from_file(tmp_path / "bad")
    assert "x-secret" not in str(e.value)
    with ServerThread(tmp_path / "s", tokens=tokens) as server:
        with pytest.raises(wire.Unauthorized):
            kvstore.connect(server.url)
        with kvstore.connect(server.url, token="r-secret") as reader:
            with pytest.raises(wire.Forbidden):
                reader.put(b"k", b"v")
            assert reader.get(b"k") is None
        with kvstore.connect(server.url, token="w-secret") as writer:
            assert writer.put(b"k", b"v") == 1
            with pytest.raises(wire.Forbidden):
                writer.snapshot()
        with kvstore.connect(server.url, token="a-secret") as admin:
            assert admin.stats()["last_lsn"] == 1
        assert httpx.get(server.url + "/healthz").status_code == 200


# -- walkv serve ------------------------------------------------------------------------

def test_drain_waits_for_a_body_still_arriving_and_refuses_new_streams(tmp_path) -> None:
    """:func:`kvstore.server.drain` (what SIGTERM runs before aiohttp's
    cleanup) does not return while a request that got its ``100 Continue``
    waits for its body; a watch asked for meanwhile is a 503 the client
    resumes from; the body, sent later, is read and answered with
    ``Connection: close``; then the drain returns True."""
    from aiohttp import web

    from kvstore.server import drain, make_app

    async def main() -> None:
        with kvstore.open(tmp_path / "s") as db:
            app = make_app(db)
            runner = web.AppRunner(app, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"PUT /v1/kv/late HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
            assert (await reader.readline()).startswith(b"HTTP/1.1 100")
            await reader.readline()  # the blank line after the 100
            draining = asyncio.create_task(drain(app, 60.0))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                refused = await client.get("/v1/watch")
            assert refused.status_code == 503 and refused.json()["error"]["type"] == "ServerUnavailable"
            assert not draining.done()
            writer.write(b"body")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower(), head
            assert await draining is True
            assert await reader.read() == json.dumps({"lsn": 1}, separators=(",", ":")).encode()
            writer.close()
            await runner.cleanup()
            assert db.get(b"late") == b"body"

    asyncio.run(main())


def test_walkv_serve_says_where_it_listens_and_sigterm_closes_the_store_cleanly(tmp_path) -> None:
    store = str(tmp_path / "s")
    with subprocess.Popen([sys.executable, "-m", "kvstore.cli", "serve", store, "--listen", "127.0.0.1:0"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT) as proc:
        try:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert "listening on http://127.0.0.1:" in line
            url = line.split("listening on ", 1)[1].strip()
            r = httpx.put(url + "/v1/kv/a%2Fb", content=b"hello")
            assert r.status_code == 200 and r.json() == {"lsn": 1}
            r = httpx.get(url + "/v1/kv/a%2Fb")
            assert (r.content, r.headers["Walkv-Lsn"], r.headers["content-type"]) == (
                b"hello", "1", "application/octet-stream")
            assert httpx.get(url + "/v1/kv/a").status_code == 404
            assert httpx.get(url + "/metrics").text.count("walkv_last_lsn{") == 1
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    with kvstore.open(store) as db:  # closed cleanly: nothing to replay
        assert db.get(b"a/b") == b"hello" and db.replayed == 0


def test_walkv_serve_refuses_a_network_address_without_tokens(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "serve", str(tmp_path / "s"), "--listen", "0.0.0.0:0"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "without --tokens" in r.stderr and "--insecure" in r.stderr


# -- TLS ---------------------------------------------------------------------------------

def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def pki(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d = tmp_path / "pki"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=walkv test CA", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *(["-extfile", "san.ext"] if name == "server" else []), cwd=d)
    return d


def test_tls_with_and_without_client_certificates(tmp_path, pki) -> None:
    tls = tls_context(str(pki / "server.pem"), str(pki / "server.key"), str(pki / "ca.pem"))
    with ServerThread(tmp_path / "s", tls=tls) as server:
        assert server.url.startswith("https://127.0.0.1:")
        client_cert = (str(pki / "client.pem"), str(pki / "client.key"))
        with kvstore.connect(server.url, verify=str(pki / "ca.pem"), cert=client_cert) as db:
            assert db.put(b"k", b"v") == 1 and db.get(b"k") == b"v"
        with pytest.raises(wire.ServerUnavailable):  # the server requires a client certificate
            kvstore.connect(server.url, verify=str(pki / "ca.pem"))
        with pytest.raises(wire.ServerUnavailable):  # the client does not trust the server's CA
            kvstore.connect(server.url, cert=client_cert)


# -- what a request gets wrong -----------------------------------------------------------

def test_bad_requests_get_the_json_error_and_change_nothing(tmp_path) -> None:
    with ServerThread(tmp_path / "s") as server, kvstore.connect(server.url) as db:
        db.put(b"keep", b"1")
        for path, body in [("/v1/delete_range", b"{}"), ("/v1/batch", b'{"ops": [{"op": "delete_range"}]}'),
                           ("/v1/batch", b"not json"), ("/v1/txn", b'{"conditions": [{"key": "a"}]}'),
                           ("/v1/batch", b'{"ops": [{"op": "put", "key": "!!", "value": ""}]}'),
                           ("/v1/get_many", b"[" * 100_000 + b"]" * 100_000)]:
            r = httpx.post(server.url + path, content=body)
            assert r.status_code == 400 and r.json()["error"]["type"] in ("BadRequest", "ValueError"), (path, body)
        for params in ({"after": "!!"}, {"after": ":"}, {"min_lsn": "1", "min_lsn_timeout": "-1"}):
            assert httpx.get(server.url + "/v1/scan", params=params).status_code == 400, params
        port = int(server.url.rsplit(":", 1)[1])
        for raw in (b"GARBAGE\r\n\r\n", b"GET /v1/info HTTP/1.1\r\nAuthorization: Bearer " + b"t" * 20000 + b"\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(raw)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.0 400") and b"application/json" in head
            assert json.loads(body)["error"]["type"] == "BadRequest" and b"ttt" not in answer  # nothing echoed
        assert db.last_lsn == 1 and db.get(b"keep") == b"1"
