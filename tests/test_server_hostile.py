"""Hostile requests against one ``walkv serve`` process: generated (hypothesis,
derandomized by tests/conftest.py) bad JSON, bad base64, wrong types,
negative and huge LSNs and limits, oversize keys, values and bodies, huge
headers, path tricks in keys (``..``, ``%00``, ``%2F``, invalid
percent-encoding), a batch that is valid but for one op.

Every one of them, sent with the admin token (so that the refusal is the
server's judgement of the request, not of the caller):

* answers 4xx with the JSON error ``{"error": {"type", "message"}}`` (never a
  5xx, never a traceback, never a success);
* leaves the server serving (``/healthz``) and the store unchanged (its last
  LSN after each request; every key, value, snapshot and subscription, read
  from the files once the server stopped, at the end).
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import urllib.parse
from typing import Any, Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server_fixture import (
    SUBSCRIPTION,
    ServedStore,
    fingerprint,
    new_token,
    raw_request,
    seed_store,
)

MAX_KEY_BYTES = 511
TOKENS = {"read": new_token("read"), "write": new_token("write"), "admin": new_token("admin")}

hostile = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Served:
    """The module's server, an admin client, and the store's last LSN before
    any hostile request."""

    def __init__(self, server: ServedStore, before: dict[str, Any]) -> None:
        self.server = server
        self.before = before
        self.admin = server.client("admin", timeout=30)
        self.last_lsn = before["last_lsn"]

    def check(self, status: int, body: bytes, headers: httpx.Headers | dict[str, str], what: str) -> None:
        """The answer is a 4xx with the JSON error, and nothing changed."""
        self.unchanged(what)  # first: so that a write is blamed on the request that made it
        assert 400 <= status < 500, f"{what}: {status} {body[:500]!r}"
        ctype = headers.get("content-type", "")
        assert ctype.startswith("application/json"), f"{what}: {status} {ctype} {body[:500]!r}"
        doc = json.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        assert isinstance(err, dict), f"{what}: {doc!r}"
        assert isinstance(err.get("type"), str) and err["type"], f"{what}: {doc!r}"
        assert isinstance(err.get("message"), str) and err["message"], f"{what}: {doc!r}"
        assert "Traceback" not in err["message"], f"{what}: {doc!r}"

    def unchanged(self, what: str) -> None:
        assert self.server.alive(), f"{what}: the server died\n{self.server.output()}"
        assert self.admin.get("/healthz").status_code == 200, what
        bounds = self.admin.get("/v1/log/bounds")
        assert bounds.status_code == 200, (what, bounds.text)
        last, self.last_lsn = self.last_lsn, bounds.json()["last_lsn"]  # (so one failure does not fail the rest)
        assert self.last_lsn == last, f"{what} wrote to the store (last LSN {last} -> {self.last_lsn})"

    def send(self, method: str, path: str, *, what: str, **kwargs: Any) -> None:
        """Send with the admin client (streaming, so an accepted watch does not
        hang the test) and check the answer."""
        with self.admin.stream(method, path, **kwargs) as resp:
            body = resp.read() if resp.status_code >= 400 else b"<a success: not read>"
            self.check(resp.status_code, body, resp.headers, what)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    store = str(tmp_path_factory.mktemp("hostile") / "store")
    seed_store(store)
    before = fingerprint(store)
    with ServedStore(store, tokens=TOKENS) as server:
        s = Served(server, before)
        yield s
        # At the module's end, whichever test ran last: the server stops cleanly and the files
        # hold exactly what they held before the first hostile request.
        s.admin.close()
        assert server.stop() == 0, server.output()
        assert "Traceback" not in server.output(), server.output()
        assert fingerprint(server.store) == before


# -- strategies --------------------------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                  st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=4)),
                           max_leaves=8)
not_a_string = json_values.filter(lambda v: not isinstance(v, str) and v is not None)
not_a_list = json_values.filter(lambda v: not isinstance(v, list))

# Strings that are not standard base64 with padding: a character outside the
# alphabet, a length that is not a multiple of 4, padding in the middle, the
# URL-safe alphabet.
bad_base64 = st.one_of(
    st.sampled_from(["!!!!", "abc", "a===", "ab=c", "-_-_", "YQ", "YQ=", "Y Q==", "YQ==\n", "====", "é===",
                     "YWJj\x00", "%YQ=="]),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", min_size=1,
            max_size=15).filter(lambda s: len(s) % 4 != 0),
    st.text(min_size=1, max_size=12).map(lambda s: s + "*"),
)
a_bad_key = st.one_of(bad_base64, not_a_string,
                      st.binary(min_size=MAX_KEY_BYTES + 1, max_size=MAX_KEY_BYTES + 600).map(b64),
                      st.just(""))  # the empty key
a_bad_value = st.one_of(bad_base64, not_a_string.filter(lambda v: v is not None))

# A JSON LSN that is not one: negative, past 2**64, not an integer, a boolean.
bad_lsn = st.one_of(st.integers(max_value=-1), st.integers(min_value=2**64, max_value=2**200), st.booleans(),
                    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f)),
                    st.text(max_size=10), st.lists(st.integers(), max_size=2))
# The same as a query parameter's text.
bad_int_text = st.one_of(
    st.integers(max_value=-1).map(str),
    st.integers(min_value=2**64, max_value=2**200).map(str),
    st.sampled_from(["x", "1.5", "1e3", "nan", "inf", "-inf", "0x10", "true", "None", "--1", "1 2", "+-1",
                     "9" * 400, "1\x00"]),
)


def good_put(key: bytes) -> dict[str, Any]:
    return {"op": "put", "key": b64(key), "value": b64(b"should never land")}


@st.composite
def bad_ops(draw: st.DrawFn) -> Any:
    """An op that cannot be applied."""
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return {"op": draw(st.text(max_size=12).filter(lambda s: s not in ("put", "delete", "delete_range"))),
                "key": b64(b"x")}
    if kind == 1:
        return {"op": "put", "key": draw(a_bad_key), "value": b64(b"v")}
    if kind == 2:
        return {"op": "put", "key": b64(b"hostile-ok"), "value": draw(a_bad_value)}
    if kind == 3:
        return {"op": "delete", "key": draw(a_bad_key)}
    if kind == 4:
        return {"op": "delete_range", "start": draw(st.one_of(bad_base64, not_a_string)), "end": None}
    if kind == 5:
        return {"op": "put"}  # no key, no value
    return draw(json_values.filter(lambda v: not isinstance(v, dict)))


@st.composite
def bad_batches(draw: st.DrawFn) -> Any:
    """A batch that is valid but for one op (atomic: nothing of it may land),
    or one whose ``ops`` is not a list of ops at all."""
    if draw(st.booleans()):
        good = [good_put(b"hostile-%d" % i) for i in range(draw(st.integers(0, 3)))]
        at = draw(st.integers(0, len(good)))
        return {"ops": good[:at] + [draw(bad_ops())] + good[at:]}
    return draw(st.one_of(st.fixed_dictionaries({"ops": not_a_list}), json_values.filter(
        lambda v: not isinstance(v, dict))))


@st.composite
def bad_conditions(draw: st.DrawFn) -> Any:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return {"key": draw(a_bad_key), "present": True}
    if kind == 1:
        return {"key": b64(b"k01"), "equals": draw(a_bad_value)}
    if kind == 2:
        return {"key": b64(b"k01")}  # no test at all
    if kind == 3:
        return {"key": b64(b"k01"), "absent": draw(st.one_of(st.integers(), st.text(), st.none()))}
    return draw(json_values.filter(lambda v: not isinstance(v, dict)))


@st.composite
def bad_txns(draw: st.DrawFn) -> Any:
    """A transaction whose conditions would all hold (k01 is present) and whose
    write would land, but for one malformed condition or op."""
    holds = [{"key": b64(b"k01"), "present": True}]
    writes = [good_put(b"hostile-txn")]
    if draw(st.booleans()):
        return {"conditions": holds + [draw(bad_conditions())], "ops": writes}
    if draw(st.booleans()):
        return {"conditions": holds, "ops": writes + [draw(bad_ops())]}
    return {"conditions": draw(st.one_of(not_a_list, st.just(holds))), "ops": draw(not_a_list)}


@st.composite
def bad_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """(path, body) for the JSON endpoints."""
    kind = draw(st.integers(0, 6))
    if kind == 0:  # not JSON, or not UTF-8
        path = draw(st.sampled_from(["/v1/get_many", "/v1/batch", "/v1/txn", "/v1/delete_range",
                                     f"/v1/subscriptions/{SUBSCRIPTION}/ack"]))
        raw = draw(st.one_of(st.binary(max_size=40), st.sampled_from(
            [b"", b"{", b"[]", b"null", b'{"ops": [', b"\xff\xfe{}", b'{"keys": ["YQ=="]}garbage', b"NaN",
             b"\x00", b'"\xff"'])))
        try:
            if isinstance(json.loads(raw), dict):
                raw = raw + b"}"  # an object by chance (e.g. {}): break it
        except ValueError:
            pass  # not JSON (or not UTF-8): what this case wants
        return path, raw
    if kind == 1:
        doc = draw(st.one_of(st.fixed_dictionaries({"keys": not_a_list}),
                             st.fixed_dictionaries({"keys": st.lists(a_bad_key, min_size=1, max_size=3)}),
                             st.fixed_dictionaries({"keys": st.just([b64(b"k01")]), "min_lsn": bad_lsn})))
        return "/v1/get_many", json.dumps(doc).encode()
    if kind == 2:
        return "/v1/batch", json.dumps(draw(bad_batches())).encode()
    if kind == 3:
        return "/v1/txn", json.dumps(draw(bad_txns())).encode()
    if kind == 4:
        doc = draw(st.one_of(
            st.fixed_dictionaries({"start": st.one_of(bad_base64, not_a_string), "end": st.just(b64(b"k05"))}),
            st.fixed_dictionaries({"start": st.just(b64(b"k")), "end": st.one_of(bad_base64, not_a_string)}),
            st.fixed_dictionaries({"start": st.just(b64(b"k"))}),  # no end
            json_values.filter(lambda v: not isinstance(v, dict))))
        return "/v1/delete_range", json.dumps(doc).encode()
    if kind == 5:
        return f"/v1/subscriptions/{SUBSCRIPTION}/ack", json.dumps(
            draw(st.one_of(st.fixed_dictionaries({"lsn": bad_lsn}), st.just({}),
                           json_values.filter(lambda v: not isinstance(v, dict))))).encode()
    # Numbers JSON allows but Python's parser turns into floats or refuses.
    return draw(st.sampled_from(["/v1/get_many", "/v1/batch"])), draw(st.sampled_from(
        [b'{"keys": [], "min_lsn": 1e400}', b'{"keys": [], "min_lsn": -0.0}', b'{"ops": 1' + b"0" * 5000 + b"}",
         b'{"keys": [], "min_lsn": Infinity}', b"[" * 100000 + b"]" * 100000]))


# Query parameters: (path, parameter, values that must be refused). A scan's
# continuation token is opaque, but any text that is not URL-safe base64 is
# surely not one the server gave.
over_page = st.integers(10_001, 2**63).map(str)  # a page is at most 10000 items (never an unbounded answer)
URLSAFE_BASE64 = re.compile(r"([A-Za-z0-9_-]{4})*([A-Za-z0-9_-]{2}==|[A-Za-z0-9_-]{3}=)?")
QUERY_TARGETS: list[tuple[str, str, st.SearchStrategy[str]]] = [
    ("/v1/kv/k01", "min_lsn", bad_int_text),
    ("/v1/kv/k01", "min_lsn_timeout", st.one_of(st.sampled_from(["-1", "nan", "inf", "x", "1e999", "61"]),
                                                 st.integers(max_value=-1).map(str))),
    ("/v1/scan", "limit", st.one_of(bad_int_text, st.just("0"), over_page)),
    ("/v1/scan", "reverse", st.sampled_from(["2", "-1", "yes", "truthy", "1.0"])),
    ("/v1/scan", "after", st.text(min_size=1, max_size=30).filter(lambda t: not URLSAFE_BASE64.fullmatch(t))),
    ("/v1/scan", "min_lsn", bad_int_text),
    ("/v1/log/entries", "from_lsn", bad_int_text),
    ("/v1/log/entries", "limit", st.one_of(bad_int_text, st.just("0"), over_page)),
    ("/v1/log/segment", "from_lsn", bad_int_text),
    ("/v1/watch", "from_lsn", bad_int_text),
    ("/v1/watch", "progress_every", st.sampled_from(["-1", "0", "nan", "inf", "x", "1e999"])),
    ("/v1/watch", "on_gap", st.text(min_size=1, max_size=10).filter(lambda s: s not in ("error", "snapshot"))),
]


@st.composite
def bad_queries(draw: st.DrawFn) -> tuple[str, dict[str, str]]:
    path, name, values = draw(st.sampled_from(QUERY_TARGETS))
    params = {name: draw(values)}
    if path == "/v1/kv/k01" and name == "min_lsn_timeout":
        params["min_lsn"] = "1"
    if path == "/v1/scan" and name == "after":
        params["limit"] = "2"
    if path in ("/v1/log/entries", "/v1/watch") and name != "from_lsn":
        params["from_lsn"] = "1"
    return path, params


# Path pieces that try to leave /v1/kv/ or confuse a decoder: whatever they
# are, everything after /v1/kv/ is one key (absent from the store: 404).
PATH_TRICKS = ["..", ".", "../", "..%2F", "lmdb", "SESSION", "wal", "LOCK", "DURABLE", "%2e%2e", "%2E%2E", "%2F", "%2f", "/", "//", "%00", "%", "%z", "%zz", "%E0%A4%A",
               "%ff", "%C0%AE", "%252e%252e", "\\", "..%5c", ";", "%3B", "stats", "metrics", "admin",
               "snapshot", "v1", "kv", "%0d%0a", "%20", "+", "%7e", "~"]
path_keys = st.lists(st.one_of(st.sampled_from(PATH_TRICKS), st.text(alphabet="abcXYZ019-_.", min_size=1,
                                                                     max_size=4)),
                     min_size=1, max_size=6).map("".join)


# -- the tests ---------------------------------------------------------------------------------


@hostile
@given(req=bad_bodies())
def test_bad_json_bodies_are_refused_and_change_nothing(served, req):
    path, body = req
    served.send("POST", path, content=body, headers={"Content-Type": "application/json"},
                what=f"POST {path} {body[:200]!r}")


@hostile
@given(req=bad_queries())
def test_bad_query_parameters_are_refused_and_change_nothing(served, req):
    path, params = req
    served.send("GET", path, params=params, what=f"GET {path} {params!r}")


@hostile
@given(key=path_keys, role=st.sampled_from(["read", "admin"]))
def test_path_tricks_are_one_absent_key(served, key, role):
    """A GET of a key spelled with path tricks (``../stats``, ``%2e%2e``,
    ``%00``, invalid percent-encoding) names that one key, which the store
    does not have: 404 NotFound for any role, never another route (stats,
    metrics, a 403 for it)."""
    target = "/v1/kv/" + key
    resp = raw_request(served.server.host, served.server.port, "GET", target,
                       headers={"Authorization": f"Bearer {TOKENS[role]}"})
    what = f"GET {target} as {role}"
    served.check(resp.status, resp.body, resp.headers, what)
    err = json.loads(resp.body)["error"]
    assert (resp.status, err["type"]) == (404, "NotFound"), f"{what}: {resp.status} {err}"


@hostile
@given(name=path_keys)
def test_path_tricks_in_a_snapshot_file_name_reach_no_file(served, name):
    """``/v1/snapshots/{lsn}/{name}`` serves the files of a snapshot only:
    ``..``, ``%2F``, ``%00`` and friends in the name are 404, never another
    file of the store (its SESSION, its log, its LOCK)."""
    target = f"/v1/snapshots/{served.before['snapshots'][0]}/" + name
    resp = raw_request(served.server.host, served.server.port, "GET", target,
                       headers={"Authorization": f"Bearer {TOKENS['read']}"})
    served.check(resp.status, resp.body, resp.headers, f"GET {target}")
    assert resp.status == 404, (target, resp.status, resp.body)


@hostile
@given(size=st.integers(MAX_KEY_BYTES + 1, 4096), byte=st.binary(min_size=1, max_size=1))
def test_oversize_keys_are_refused(served, size, byte):
    """(A get_many of an oversize key is [null], as the embedded API's.)"""
    key = urllib.parse.quote_from_bytes(byte * size, safe="")
    served.send("PUT", "/v1/kv/" + key, content=b"v", what=f"PUT a {size}-byte key")
    served.send("GET", "/v1/kv/" + key, what=f"GET a {size}-byte key")  # 404, as the embedded get's None


@hostile
@given(kind=st.sampled_from(["long", "many", "binary", "auth"]), size=st.integers(1, 4))
def test_huge_and_strange_headers_are_refused(served, kind, size):
    if kind == "long":
        headers = {"X-Filler": "a" * (size * 40_000)}
    elif kind == "many":
        headers = {f"X-Filler-{i}": "b" * 100 for i in range(size * 250)}
    elif kind == "binary":
        headers = {"X-Filler": "\x01\x7f" * size}
    else:
        headers = {"Authorization": "Bearer " + "c" * (size * 30_000)}
    resp = raw_request(served.server.host, served.server.port, "PUT", "/v1/kv/header-test",
                       headers={"Authorization": f"Bearer {TOKENS['admin']}", **headers}, body=b"v")
    served.check(resp.status, resp.body, resp.headers, f"{kind} headers x{size}")


MALFORMED_HTTP = [
    b"PUT /v1/kv/smuggle HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"PUT /v1/kv/twice HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    b"PUT /v1/kv/negative HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"PUT /v1/kv/huge HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    b"PUT /v1/kv/chunks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
    b"GARBAGE\r\n\r\n",
    b"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/k\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/k\xff HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/k00 HTTP/1.1\r\nHost: x\r\nBad Header Name: 1\r\n\r\n",
]


@pytest.mark.parametrize("request_bytes", MALFORMED_HTTP, ids=lambda b: b.split(b"\r\n")[0][:40].decode("latin-1"))
def test_malformed_http_is_a_json_400_and_writes_nothing(served, request_bytes):
    """What the HTTP parser refuses (request smuggling's CL+TE, two lengths,
    bad lengths and chunks, a request line that is not one) gets the same
    JSON error as everything else, and no write."""
    auth = f"Authorization: Bearer {TOKENS['admin']}\r\n".encode()
    line, _, rest = request_bytes.partition(b"\r\n")
    with socket.create_connection((served.server.host, served.server.port), timeout=30) as sock:
        sock.sendall(line + b"\r\n" + auth + rest)
        resp = http.client.HTTPResponse(sock, method="GET")
        resp.begin()
        body = resp.read()
    served.check(resp.status, body, {k.lower(): v for k, v in resp.getheaders()}, repr(request_bytes[:60]))


def test_an_unknown_route_or_method_is_the_json_404_or_405(served):
    for method, path in [("GET", "/v1/nope"), ("GET", "/v2/kv/k01"), ("POST", "/v1/kv/k01"),
                         ("PATCH", "/v1/kv/k01"), ("GET", "/v1/batch"), ("PUT", "/v1/log/bounds"),
                         ("GET", "/"), ("GET", "/v1/kv/")]:
        served.send(method, path, what=f"{method} {path}")


def test_a_body_over_the_limit_is_413(served):
    """The body limit (default: the store's largest record, 64 MiB) holds for
    the raw value of a put and for a JSON body."""
    big = b"x" * ((64 << 20) + 4096)
    for path, method in [("/v1/kv/too-big", "PUT"), ("/v1/batch", "POST")]:
        try:
            with served.admin.stream(method, path, content=big) as resp:
                body = resp.read()
        except httpx.TransportError:  # answered early and closed while the body was still being sent
            served.unchanged(f"{method} {path} with a 64 MiB body")
            continue
        served.check(resp.status_code, body, resp.headers, f"{method} {path} with a 64 MiB body")
        assert resp.status_code == 413, resp.status_code


def test_path_tricks_round_trip_as_keys(tmp_path):
    """What the hostile GETs above rely on: a key written with path tricks in
    its percent-encoded spelling is stored as exactly the bytes
    ``unquote_to_bytes`` makes of it, and read back by the same spelling."""
    store = str(tmp_path / "store")
    seed_store(store, keys=1)
    tricks = ["..", "a/../b", "%2e%2e/x", "a%2Fb", "%00", "%", "%zz", "%E0%A4%A", "%ff%fe", "./.", "//x", "%252F"]
    with ServedStore(store) as server:
        for i, spelling in enumerate(tricks):
            put = raw_request(server.host, server.port, "PUT", "/v1/kv/" + spelling, body=b"value %d" % i)
            assert put.status == 200, (spelling, put.status, put.body)
            got = raw_request(server.host, server.port, "GET", "/v1/kv/" + spelling)
            assert (got.status, got.body) == (200, b"value %d" % i), (spelling, got.status, got.body)
        assert server.stop() == 0
    items = dict(fingerprint(store)["items"])
    for i, spelling in enumerate(tricks):
        assert items.get(urllib.parse.unquote_to_bytes(spelling)) == b"value %d" % i, spelling
    assert len(items) == 1 + 1 + len(tricks)  # k00, after-snapshot, the tricks
