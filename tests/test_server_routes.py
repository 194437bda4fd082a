"""The role and the route come from one parse of the raw request target
(kvstore/server/routes.py): the role matrix.

Every route of the server, spelled every way a request line can spell it,
sent with every kind of token (none, read, write, admin), on real HTTP:

* the canonical spelling and the absolute form (``PUT http://h/v1/kv/k``,
  which RFC 9112 makes servers accept) act as the route with the token's
  role: 401 without a token, 403 below the route's role, the handler's
  answer at or above it;
* every other spelling of the route's fixed part, each fixed character
  percent-encoded (``%6Bv``, ``%6bv``, ``%2F``...), all of them at once, ``//``,
  ``/./``, ``/../``, a trailing ``/``, the absolute form of those, is no route:
  401 without a token (or the parser's 400), 400/404/405 (or 403) with one,
  never the handler;
* whenever the answer is a refusal, nothing was written: the store's last
  LSN, its snapshots and its subscriptions (read from the store object the
  server serves) are as before.

Issue 33: ``PUT /v1/%6Bv/victim`` with a read token answered 200 and wrote.
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import kvstore
from kvstore.server import Tokens
from tests.served import ServerThread
from tests.server_fixture import SUBSCRIPTION, new_token, seed_store

ROLES = (None, "read", "write", "admin")
RANK = {None: -1, "read": 0, "write": 1, "admin": 2, "open": -1}
SNAPSHOT_LSN = 20  # seed_store's snapshot
REFUSALS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass(frozen=True)
class Endpoint:
    """A request of one route: ``pattern`` as the server's table spells it
    (checked against it below), ``values`` for its parameters, and the
    statuses its handler answers with for a token that may use it."""

    method: str
    pattern: str
    role: str
    values: tuple[tuple[str, str], ...] = ()
    query: str = ""
    body: Any = None
    ok: tuple[int, ...] = (200,)

    def segments(self) -> list[tuple[str, bool]]:
        """The concrete path's segments, each (text, fixed?)."""
        values = dict(self.values)
        out = []
        for segment in self.pattern[1:].split("/"):
            if segment.startswith("{"):
                out.append((values[segment.strip("{}*")], False))
            else:
                out.append((segment, True))
        return out


STREAM_END = "timeout=0.01"

ENDPOINTS = [
    Endpoint("GET", "/v1/kv/{key*}", "read", (("key", "k01"),)),
    Endpoint("HEAD", "/v1/kv/{key*}", "read", (("key", "k01"),)),
    Endpoint("PUT", "/v1/kv/{key*}", "write", (("key", "victim"),), body=b"pwned"),
    Endpoint("DELETE", "/v1/kv/{key*}", "write", (("key", "k02"),)),
    Endpoint("GET", "/v1/ttl/{key*}", "read", (("key", "k01"),)),
    Endpoint("GET", "/v1/info", "read"),
    Endpoint("GET", "/v1/count", "read"),
    Endpoint("GET", "/v1/scan", "read", query="prefix=k&limit=3"),
    Endpoint("POST", "/v1/get_many", "read", body={"keys": [b64(b"k01")]}),
    Endpoint("POST", "/v1/delete_range", "write", body={"start": b64(b"k05"), "end": b64(b"k06")}),
    Endpoint("POST", "/v1/batch", "write", body={"ops": [{"op": "put", "key": b64(b"b1"), "value": b64(b"v")}]}),
    Endpoint("POST", "/v1/txn", "write", body={"conditions": [{"key": b64(b"never"), "absent": True}],
                                                "ops": [{"op": "put", "key": b64(b"t1"), "value": b64(b"v")}]}),
    Endpoint("GET", "/v1/keyspaces", "read"),
    Endpoint("DELETE", "/v1/keyspaces/{name}", "write", (("name", "users"),)),
    Endpoint("POST", "/v1/leases", "write", body={"ttl": 10}),
    Endpoint("GET", "/v1/leases/{id}", "read", (("id", "12345"),), ok=(404,)),
    Endpoint("POST", "/v1/leases/{id}/keepalive", "write", (("id", "12345"),), ok=(404,)),
    Endpoint("DELETE", "/v1/leases/{id}", "write", (("id", "12345"),), ok=(404,)),
    Endpoint("GET", "/v1/watch", "read", query=f"from_lsn=1&{STREAM_END}"),
    Endpoint("GET", "/v1/subscriptions", "read"),
    Endpoint("POST", "/v1/subscriptions/{name}", "write", (("name", "made"),), body={"from_lsn": 1}),
    Endpoint("GET", "/v1/subscriptions/{name}/events", "write", (("name", "fresh"),),
             query=f"from_lsn=1&{STREAM_END}"),
    Endpoint("POST", "/v1/subscriptions/{name}/ack", "write", (("name", SUBSCRIPTION),), body={"lsn": 1}),
    Endpoint("DELETE", "/v1/subscriptions/{name}", "write", (("name", "doomed"),), ok=(200, 404)),
    Endpoint("GET", "/v1/log/bounds", "read"),
    Endpoint("GET", "/v1/log/entries", "read", query="from_lsn=1&limit=2"),
    Endpoint("GET", "/v1/log/segment", "read", query="from_lsn=1"),
    Endpoint("GET", "/v1/snapshots", "read"),
    Endpoint("GET", "/v1/snapshots/{lsn}/{name}", "read", (("lsn", str(SNAPSHOT_LSN)), ("name", "MANIFEST"))),
    Endpoint("POST", "/v1/admin/snapshot", "admin"),
    Endpoint("POST", "/v1/admin/sync", "write"),
    Endpoint("GET", "/v1/stats", "admin"),
    Endpoint("GET", "/metrics", "admin"),
    Endpoint("GET", "/healthz", "open"),
    Endpoint("GET", "/readyz", "open"),
]


def _encoded(ch: str) -> list[str]:
    """``ch`` percent-encoded, in upper- and (where the hex has a letter) lower-case hex."""
    upper = "%{:02X}".format(ord(ch))
    return [upper] if upper.lower() == upper else [upper, upper.lower()]


def spellings(ep: Endpoint) -> list[tuple[str, str, bool]]:
    """``(kind, target, same route?)`` for every spelling of ``ep``'s route."""
    segments = ep.segments()
    tail = ep.pattern.endswith("*}")
    path = "/" + "/".join(text for text, _ in segments)
    query = "?" + ep.query if ep.query else ""
    # the route part: the path up to a {key*}'s value; its fixed characters
    route_end = len(path) - len(segments[-1][0]) if tail else len(path)
    fixed: list[int] = []
    at = 0
    for text, is_fixed in segments:
        fixed.append(at)  # the '/' before the segment
        if is_fixed:
            fixed.extend(range(at + 1, at + 1 + len(text)))
        at += 1 + len(text)
    slashes = [i for i in fixed if path[i] == "/" and i < route_end and not (tail and i == route_end - 1)]
    out = [("canonical", path + query, True), ("absolute", "http://h" + path + query, True),
           ("absolute, scheme in capitals, a port", "HTTP://example.org:80" + path + query, True)]
    for i in fixed:
        for spelled in _encoded(path[i]):
            out.append((f"{path[i]!r} as {spelled}", path[:i] + spelled + path[i + 1:] + query, False))
    everything = "".join(_encoded(c)[0] if i in fixed else c for i, c in enumerate(path))
    out.append(("every fixed character encoded", everything + query, False))
    first = next(i for i in fixed if path[i] != "/")
    out.append(("absolute, one character encoded",
                "http://h" + path[:first] + _encoded(path[first])[-1] + path[first + 1:] + query, False))
    for i in slashes:
        out.append((f"// at {i}", path[:i] + "/" + path[i:] + query, False))
        out.append((f"/./ at {i}", path[:i] + "/." + path[i:] + query, False))
        out.append((f"/../ at {i}", path[:i] + "/x/.." + path[i:] + query, False))
    if not tail:
        out.append(("a trailing /", path + "/" + query, False))
    return out


# -- the server --------------------------------------------------------------------------------


class Matrix:
    def __init__(self, db: kvstore.KVStore, server: ServerThread, tokens: dict[str, str]) -> None:
        self.db = db
        self.host, port = server.url.removeprefix("http://").split(":")
        self.port = int(port)
        self.tokens = tokens
        self.conns: dict[str | None, http.client.HTTPConnection] = {}

    def send(self, method: str, target: str, role: str | None, body: Any) -> tuple[int, dict[str, Any]]:
        conn = self.conns.get(role)
        if conn is None:
            conn = self.conns[role] = http.client.HTTPConnection(self.host, self.port, timeout=30)
        headers = {"Authorization": f"Bearer {self.tokens[role]}"} if role else {}
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        conn.request(method, target, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        doc: dict[str, Any] = {}
        if resp.status >= 400 and method != "HEAD":
            doc = json.loads(raw)["error"]
        return resp.status, doc

    def written(self) -> tuple[Any, ...]:
        """What a request could change: the log, the snapshots, the subscriptions."""
        return (self.db.last_lsn, tuple(s.lsn for s in self.db.list_snapshots()),
                tuple((s.name, s.acked_lsn) for s in self.db.subscriptions()))


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    path = str(tmp_path_factory.mktemp("routes") / "store")
    seed_store(path)
    tokens = {role: new_token(role) for role in ROLES if role}
    with kvstore.open(path) as db:
        with db.subscribe("doomed", from_lsn=1):
            pass
        server = ServerThread(db, tokens=Tokens([(role, token) for role, token in tokens.items()]))
        try:
            m = Matrix(db, server, tokens)
            # a stream of the subscription delivered changes: its ack route acts
            assert m.send("GET", f"/v1/subscriptions/{SUBSCRIPTION}/events?prefix=k&{STREAM_END}", "admin",
                          None)[0] == 200
            yield m
            for conn in m.conns.values():
                conn.close()
        finally:
            server.stop()


def test_the_matrix_covers_every_route_of_the_server():
    """The one look inside: the table's routes are exactly ENDPOINTS'
    (method, pattern), so a new route cannot escape the matrix."""
    from kvstore.server.app import ROUTES

    assert sorted((r.method, r.pattern) for r in ROUTES) == sorted((e.method, e.pattern) for e in ENDPOINTS)


@pytest.mark.parametrize("ep", ENDPOINTS, ids=lambda e: f"{e.method} {e.pattern}")
def test_every_spelling_of_every_route_with_every_token(matrix, ep):
    cases = 0
    for kind, target, same in spellings(ep):
        for role in ROLES:
            what = f"{ep.method} {target} ({kind}) with {role or 'no'} token"
            before = matrix.written()
            status, err = matrix.send(ep.method, target, role, ep.body)
            cases += 1
            allowed = same and RANK[role] >= RANK[ep.role]
            if allowed:
                assert status in ep.ok, f"{what}: {status} {err}"
                assert not err or (err["type"] not in ("Unauthorized", "Forbidden", "MethodNotAllowed")
                                   and not err["message"].startswith("no such route")), f"{what}: {err}"
                continue
            assert matrix.written() == before, f"{what} answered {status} and wrote"
            if same:
                assert status == (401 if role is None else 403), f"{what}: {status} {err}"
            else:  # (400: a target the HTTP parser refuses, e.g. one that does not start with '/')
                assert status in ((400, 401) if role is None else (400, 403, 404, 405)), f"{what}: {status} {err}"
            assert ep.method == "HEAD" or err["type"] == REFUSALS[status], f"{what}: {status} {err}"
    print(f"{ep.method} {ep.pattern}: {cases} cases")


def test_the_matrix_size():
    """Printed for the issue's note: routes x spellings x tokens."""
    sizes = [len(spellings(ep)) for ep in ENDPOINTS]
    print(f"role matrix: {len(ENDPOINTS)} routes x {min(sizes)}-{max(sizes)} spellings (sum {sum(sizes)}) "
          f"x {len(ROLES)} tokens = {sum(sizes) * len(ROLES)} requests")
    assert sum(sizes) * len(ROLES) > 1000


# -- the requests, by name ------------------------------------------------------------


@pytest.mark.parametrize("method,target", [
    ("PUT", "/v1/%6Bv/victim"), ("PUT", "/v1/%6bv/victim"), ("PUT", "/v1/k%76/x"), ("DELETE", "/v1/%6Bv/k03"),
    ("PUT", "http://h/v1/kv/abs"),
])
def test_a_read_token_never_writes(matrix, method, target):
    before = matrix.written()
    status, err = matrix.send(method, target, "read", b"pwned")
    assert status in (403, 404), (status, err)
    assert matrix.written() == before
    assert matrix.db.get(b"v/victim") is None and matrix.db.get(b"h/v1/kv/abs") is None


def test_the_absolute_form_is_the_path_it_names(matrix):
    status, _ = matrix.send("PUT", "http://h/v1/kv/abs", "write", b"value")
    assert status == 200
    assert matrix.db.get(b"abs") == b"value" and matrix.db.get(b"h/v1/kv/abs") is None


@pytest.mark.parametrize("method,target", [
    ("OPTIONS", "*"), ("GET", "ftp://h/v1/info"), ("GET", "http://user@h/v1/info"), ("GET", "http:///v1/info"),
    ("GET", "/v1/kv/k01#fragment"),
])
def test_other_request_target_forms_are_400(matrix, method, target):
    status, err = matrix.send(method, target, "admin", None)
    assert (status, err["type"]) == (400, "BadRequest"), (status, err)


@pytest.mark.parametrize("role,status", [(None, 401), ("read", 403), ("write", 403), ("admin", 405)])
@pytest.mark.parametrize("method", ["HEAD", "OPTIONS", "PUT"])
def test_another_method_on_an_admin_route_is_checked_like_the_route(matrix, method, role, status):
    """Item 7: HEAD and OPTIONS on admin routes were 400 for anybody."""
    got, err = matrix.send(method, "/v1/stats", role, None)
    assert got == status, (got, err)
    if status == 405 and method != "HEAD":
        assert err["type"] == "MethodNotAllowed" and "GET" in err["message"]


def test_an_unknown_query_parameter_is_400(matrix):
    before = matrix.written()
    for target in ["/v1/kv/k01?bogus=1", "/v1/scan?limit=1&limit=2", "/v1/info?x"]:
        status, err = matrix.send("GET", target, "read", None)
        assert (status, err["type"]) == (400, "BadRequest"), (target, status, err)
    status, err = matrix.send("PUT", "/v1/kv/k01?ttl_typo=5", "write", b"v")
    assert status == 400 and "ttl_typo" in err["message"], err
    assert matrix.written() == before


# -- the parse, without a server --------------------------------------------------------------


def test_split_target():
    from kvstore.server.routes import split_target

    assert split_target("/v1/kv/a%2Fb?x=1&y") == ("/v1/kv/a%2Fb", "x=1&y")
    assert split_target("http://h:80/v1/kv/a?q") == ("/v1/kv/a", "q")
    assert split_target("HTTPS://h") == ("/", "")
    assert split_target("http://h?x=1") == ("/", "x=1")


def test_route_patterns_match_raw_segments_literally():
    from kvstore.server.routes import Route

    async def handler(request, match):  # pragma: no cover - never called
        raise AssertionError

    kv = Route("GET", "/v1/kv/{key*}", handler, 1)
    sub = Route("GET", "/v1/subscriptions/{name}/events", handler, 1)
    assert kv.match(["v1", "kv", "a", "..", "b"]) == {"key": "a/../b"}
    assert kv.match(["v1", "kv", ""]) == {"key": ""}
    assert kv.match(["v1", "%6Bv", "a"]) is None and kv.match(["v1", "kv"]) is None
    assert sub.match(["v1", "subscriptions", "x", "events"]) == {"name": "x"}
    for name in ("", ".", ".."):
        assert sub.match(["v1", "subscriptions", name, "events"]) is None
    with pytest.raises(ValueError):
        Route("GET", "/v1/{key*}/x", handler, 1)
