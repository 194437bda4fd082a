"""What one client can make the server hold or wait for (issue 33):

* item 2: answers have a byte budget: a ``get_many`` over it is 413
  ``AnswerTooLarge`` saying how many keys fit (the client then asks in
  parts and gets every value), a scan page and a log answer end early and
  go on;
* item 3: JSON bodies have bounds of their own (bytes, elements), refused
  before parsing; the parse off the event loop gives what ``json.loads``
  gives; the client refuses a batch over them before sending it;
* item 4: SIGTERM answers a long poll and a ``min_lsn`` wait at once, with
  a proper answer, not a connection cut after the shutdown timeout;
* item 7: a token's share of the stream slots; ``bearer`` in lower case;
  a subscription past the end of the log; ``walkv serve`` without uvloop.

How much memory and time the abuse of items 2 and 3 cost before and after
is measured, not asserted here: ``python -m benchmarks.server_abuse``.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvstore
from kvstore.client.wire import AnswerTooLarge, BadRequest, PayloadTooLarge
from kvstore.server import Limits, Tokens
from tests.served import ServerThread
from tests.server_fixture import ServedStore, new_token, seed_store

BIG = 256 * 1024
SMALL = Limits(max_answer_bytes=1 << 20, max_json_bytes=128 * 1024, max_json_items=5000)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory):
    """A store with a 256 KiB key and 30 keys of 100 KiB, served with small limits."""
    path = tmp_path_factory.mktemp("limits") / "store"
    with kvstore.open(path) as db:
        db.put(b"big", b"x" * BIG)
        db.update((b"v%02d" % i, bytes([i]) * (100 * 1024)) for i in range(30))
        server = ServerThread(db, limits=SMALL)
        try:
            yield db, server
        finally:
            server.stop()


# -- item 2: answers ---------------------------------------------------------------------------


def test_a_get_many_over_the_answer_budget_is_413_saying_what_fits(small):
    db, server = small
    before = db.last_lsn
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/v1/get_many", json={"keys": [b64(b"big")] * 2000})  # 15 KiB asking for 500 MiB
        assert r.status_code == 413, r.text[:200]
        err = r.json()["error"]
        assert err["type"] == "AnswerTooLarge" and err["fits"] == 4, err  # 4 x 256 KiB = the 1 MiB budget
        one = c.post("/v1/get_many", json={"keys": [b64(b"big")]})  # one value always fits
        assert one.status_code == 200 and len(base64.b64decode(one.json()["values"][0])) == BIG
    with kvstore.connect(server.url) as remote:
        assert remote.get_many([b"big"] * 20 + [b"nope"]) == [b"x" * BIG] * 20 + [None]
    assert db.last_lsn == before


def test_a_scan_page_ends_at_the_answer_budget_and_goes_on(small):
    db, server = small
    with httpx.Client(base_url=server.url, timeout=30) as c:
        page = c.get("/v1/scan", params={"prefix": "v", "limit": "1000"}).json()
    sizes = [len(base64.b64decode(k)) + len(base64.b64decode(v)) for k, v in page["items"]]
    assert sum(sizes[:-1]) < SMALL.max_answer_bytes and page["after"] is not None, sizes
    with kvstore.connect(server.url) as remote:
        assert list(remote.scan(prefix=b"v", page=1000)) == list(db.scan(prefix=b"v"))
        assert list(remote.scan(prefix=b"v", reverse=True)) == list(db.scan(prefix=b"v", reverse=True))


def test_log_entries_end_at_the_answer_budget_and_go_on(small):
    db, server = small
    seen = []
    with httpx.Client(base_url=server.url, timeout=30) as c:
        lsn = 1
        while lsn <= db.durable_lsn:
            doc = c.get("/v1/log/entries", params={"from_lsn": str(lsn), "limit": "1000"}).json()
            assert doc["entries"], doc
            seen += [e["lsn"] for e in doc["entries"]]
            assert sum(len(base64.b64decode(e["payload"])) for e in doc["entries"][:-1]) < SMALL.max_answer_bytes
            lsn = doc["next_lsn"]
    assert seen == list(range(1, db.durable_lsn + 1))


# -- item 3: JSON bodies -----------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    b'{"keys": [' + b"[]," * 50_000 + b"[]]}",                 # over the bytes (128 KiB)
    b'{"keys": [' + b",".join([b"[]"] * 5001) + b"]}",          # under them, over the elements
    b'{"ops": [' + b"[" * 3000 + b"]" * 3000 + b"]}",            # under both, nested too deep
], ids=["bytes", "elements", "nesting"])
def test_a_json_body_over_its_bounds_is_refused_and_changes_nothing(small, body):
    db, server = small
    before = db.last_lsn
    nested = body.count(b"[") < SMALL.max_json_items
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for path in ("/v1/get_many", "/v1/batch"):
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})
            err = r.json()["error"]
            if nested:
                assert (r.status_code, err["type"]) == (400, "BadRequest") and "nested" in err["message"], err
            else:
                assert (r.status_code, err["type"]) == (413, "PayloadTooLarge"), (path, r.status_code, err)
            assert c.get("/healthz").status_code == 200
    assert db.last_lsn == before


def test_a_big_batch_is_parsed_off_the_loop_and_lands(small):
    """A batch over the size parsed on the loop (and under the JSON bounds),
    into a keyspace, lands whole."""
    db, server = small
    ops = [{"op": "put", "key": b64(b"p%03d" % i), "value": b64(b"v" * 300), "keyspace": "bulk"}
           for i in range(150)]
    body = json.dumps({"ops": ops}).encode()
    from kvstore.server.bodies import INLINE_JSON_BYTES

    assert INLINE_JSON_BYTES < len(body) <= SMALL.max_json_bytes
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/v1/batch", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert len(db.keyspace("bulk")) == 150 and db.keyspace("bulk").get(b"p149") == b"v" * 300


json_docs = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                         | st.text(max_size=8), lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(doc=st.dictionaries(st.text(max_size=6), json_docs, max_size=4))
def test_the_parse_off_the_loop_is_json_loads(doc):
    from kvstore.server.bodies import _parse

    body = json.dumps(doc).encode()
    assert _parse(body, False) == _parse(body, True) == json.loads(body)


def test_the_client_refuses_a_batch_over_the_servers_json_bounds_before_sending(small):
    db, server = small
    before = db.last_lsn
    with kvstore.connect(server.url) as remote:
        with pytest.raises(PayloadTooLarge) as caught, remote.batch() as b:
            for i in range(400):
                b.put(b"q%03d" % i, b"v" * 400)
        assert isinstance(caught.value, kvstore.RecordTooLargeError) and "split" in str(caught.value)
    assert db.last_lsn == before
    assert issubclass(AnswerTooLarge, kvstore.WalkvError)


# -- item 4: the stop -------------------------------------------------------------------------


def test_sigterm_answers_long_polls_and_min_lsn_waits_at_once(tmp_path):
    """Before: both waited out --shutdown-timeout and were cut (a broken
    connection); a follower long-polling is the normal state of a server
    with replicas."""
    store = str(tmp_path / "store")
    seed_store(store, keys=2)
    answers: dict[str, Any] = {}
    with ServedStore(store, args=("--shutdown-timeout", "1")) as server:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            durable = c.get("/v1/log/bounds").json()["durable_lsn"]
        requests = {
            "entries": ("/v1/log/entries", {"from_lsn": durable + 1, "wait": 30}),
            "segment": ("/v1/log/segment", {"from_lsn": durable + 1, "wait": 30}),
            "min_lsn": ("/v1/kv/k00", {"min_lsn": durable + 100, "min_lsn_timeout": 60}),
        }
        started = threading.Barrier(len(requests) + 1)

        def ask(name: str, path: str, params: dict[str, Any]) -> None:
            with httpx.Client(base_url=server.url, timeout=60) as c:
                started.wait()
                try:
                    r = c.get(path, params=params)
                    answers[name] = (r.status_code, r.json() if r.status_code != 200 or name != "segment"
                                     else r.content)
                except httpx.TransportError as exc:
                    answers[name] = exc

        threads = [threading.Thread(target=ask, args=(name, *req)) for name, req in requests.items()]
        for t in threads:
            t.start()
        started.wait()
        with httpx.Client(base_url=server.url, timeout=60) as c:  # until the three are in their handlers
            while not _waiting(c, 3):
                time.sleep(0.01)
        assert server.stop() == 0, server.output()
        for t in threads:
            t.join(60)
    assert answers["entries"] == (200, {"entries": [], "next_lsn": durable + 1}), answers
    assert answers["segment"] == (200, b""), answers
    status, doc = answers["min_lsn"]
    assert (status, doc["error"]["type"]) == (503, "ServerUnavailable"), answers
    assert "stopping" in doc["error"]["message"]


def _waiting(c: httpx.Client, n: int) -> bool:
    """Whether ``n`` requests besides this one are in a handler (the server's in-flight gauge)."""
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("walkv_http_requests_in_flight{"):
            return float(line.split()[-1]) >= n + 1
    raise AssertionError("no walkv_http_requests_in_flight in /metrics")


# -- item 7 -----------------------------------------------------------------------------------


def test_each_token_has_its_share_of_the_stream_slots(tmp_path):
    """Before: one read token could hold every slot of --max-streams."""
    tokens = {"read": new_token("read"), "write": new_token("write")}
    with kvstore.open(tmp_path / "s") as db:
        db.put(b"k", b"v")
        server = ServerThread(db, tokens=Tokens(list(tokens.items())), limits=Limits(max_streams=4))
        try:
            with httpx.Client(base_url=server.url, timeout=30,
                              headers={"Authorization": f"Bearer {tokens['read']}"}) as reader, \
                    httpx.Client(base_url=server.url, timeout=30,
                                 headers={"Authorization": f"bearer {tokens['write']}"}) as writer:
                held = [reader.stream("GET", "/v1/watch", params={"from_lsn": "1"}) for _ in range(2)]
                for s in held:
                    assert s.__enter__().status_code == 200
                third = reader.get("/v1/watch", params={"from_lsn": "1"})
                assert third.status_code == 429 and "share" in third.json()["error"]["message"], third.text
                with writer.stream("GET", "/v1/watch", params={"from_lsn": "1"}) as other:
                    assert other.status_code == 200  # the other token still has its share (and 'bearer' works)
                for s in held:
                    s.__exit__(None, None, None)
        finally:
            server.stop()


def test_a_subscription_past_the_end_of_the_log_is_refused(small):
    db, server = small
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for req in [("POST", "/v1/subscriptions/far", {"json": {"from_lsn": db.last_lsn + 1000}}),
                    ("GET", "/v1/subscriptions/far/events", {"params": {"from_lsn": str(db.last_lsn + 1000)}})]:
            r = c.request(req[0], req[1], **req[2])
            assert r.status_code == 400 and "past the end of the log" in r.json()["error"]["message"], r.text
        r = c.post("/v1/subscriptions/near", json={"from_lsn": db.last_lsn + 1})
        assert r.status_code == 200 and r.json()["name"] == "near"
    assert [s.name for s in db.subscriptions()] == ["near"]
    db.drop_subscription("near")


def test_serve_falls_back_to_asyncios_loop_without_uvloop(tmp_path):
    code = ("import sys; sys.modules['uvloop'] = None\n"
            "from kvstore.server.run import loop_factory\n"
            "assert loop_factory() is None\n"
            "from kvstore.cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    import subprocess

    from tests.server_fixture import child_env

    proc = subprocess.Popen([sys.executable, "-c", code, "serve", str(tmp_path / "s"), "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "listening on http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() else "")
        url = line.split("listening on ")[1].strip()
        assert httpx.get(url + "/healthz").status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


def test_serve_without_the_server_extra_says_what_to_install(tmp_path):
    import subprocess

    from tests.server_fixture import child_env

    code = ("import sys; sys.modules['aiohttp'] = None\n"
            "from kvstore.cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, "serve", str(tmp_path / "s")], capture_output=True,
                          text=True, env=child_env(), timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "pip install 'walkv[server]'" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:'),
                            lambda inner: st.lists(inner, max_size=4)
                            | st.dictionaries(st.text(alphabet='[]{}"\\ab'), inner, max_size=4), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(value=_json_values)
def test_nesting_is_that_of_arrays_and_objects_whatever_the_strings_hold(value):
    from kvstore.server.bodies import nested_deeper_than

    body, depth = json.dumps(value).encode(), _depth(value)
    for limit in range(depth + 2):
        assert nested_deeper_than(body, limit) == (depth > limit), limit


def test_a_body_nested_past_the_bound_is_refused_before_it_is_parsed():
    from kvstore.server.bodies import MAX_JSON_DEPTH, _parse

    for inline in (True, False):
        with pytest.raises(BadRequest, match=f"nested more than {MAX_JSON_DEPTH} deep"):
            _parse(b'{"ops": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}", inline)
        assert _parse(b'{"ops": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}", inline)
