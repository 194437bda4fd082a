"""Nobody gets in where they don't belong: ``walkv serve`` with a tokens file,
black-box (a real subprocess, real HTTP).

* every endpoint without a token, with an unknown token, with a token in a
  comment of the tokens file, or with a token of another scheme answers 401;
  with a token whose role is too low, 403; the JSON error shape either way,
  and the store is unchanged afterwards (checked through the server, and
  directly in the files once the server stopped);
* ``/healthz`` and ``/readyz`` answer without a token;
* the tokens (valid or not) appear nowhere: not in answers, not in
  ``/metrics``, not in anything the process printed;
* ``--listen`` on a non-loopback address without tokens is refused unless
  ``--insecure``; a tokens file with a line it cannot read is refused;
* with ``--tls-cert/--tls-key`` the server speaks HTTPS (certificates from
  ``trustme``) and a plain-HTTP request gets nothing done.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any, Iterator

import httpx
import pytest

from tests.server_fixture import (
    SUBSCRIPTION,
    ServedStore,
    Tls,
    fingerprint,
    new_token,
    run_serve,
    seed_store,
    write_tokens,
)

ROLES = ("read", "write", "admin")
RANK = {None: -1, "read": 0, "write": 1, "admin": 2}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    role: str  # the lowest role allowed
    params: tuple[tuple[str, str], ...] = ()
    json: Any = None
    content: bytes | None = None

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


SNAPSHOT_LSN = 20  # seed_store's snapshot


def endpoints() -> list[Endpoint]:
    """Every endpoint of docs/http-api.md with a request that would succeed
    (or at least act) with the right role, on a store from seed_store."""
    return [
        # read
        Endpoint("GET", "/v1/kv/k01", "read"),
        Endpoint("GET", "/v1/kv/k01", "read", params=(("min_lsn", "1"),)),
        Endpoint("POST", "/v1/get_many", "read", json={"keys": [b64(b"k01"), b64(b"nope")]}),
        Endpoint("GET", "/v1/scan", "read", params=(("prefix", "k"), ("limit", "5"))),
        Endpoint("GET", "/v1/watch", "read", params=(("prefix", "k"), ("from_lsn", "1"))),
        Endpoint("HEAD", "/v1/kv/k01", "read"),
        Endpoint("GET", "/v1/info", "read"),
        Endpoint("GET", "/v1/count", "read"),
        Endpoint("GET", "/v1/count", "read", params=(("keyspace", "users"),)),
        Endpoint("GET", "/v1/ttl/k01", "read"),
        Endpoint("GET", "/v1/keyspaces", "read"),
        Endpoint("GET", "/v1/leases/12345", "read"),
        Endpoint("GET", "/v1/subscriptions", "read"),
        Endpoint("GET", "/v1/log/bounds", "read"),
        Endpoint("GET", "/v1/log/entries", "read", params=(("from_lsn", "1"), ("limit", "5"))),
        Endpoint("GET", "/v1/log/segment", "read", params=(("from_lsn", "1"),)),
        Endpoint("GET", "/v1/snapshots", "read"),
        Endpoint("GET", f"/v1/snapshots/{SNAPSHOT_LSN}/MANIFEST", "read"),
        # write
        Endpoint("PUT", "/v1/kv/k01", "write", content=b"overwritten"),
        Endpoint("PUT", "/v1/kv/new-key", "write", content=b"new"),
        Endpoint("DELETE", "/v1/kv/k02", "write"),
        Endpoint("POST", "/v1/delete_range", "write", json={"start": b64(b"k"), "end": b64(b"l")}),
        Endpoint("POST", "/v1/delete_range", "write", json={"start": None, "end": None}),
        Endpoint("POST", "/v1/batch", "write",
                 json={"ops": [{"op": "put", "key": b64(b"b1"), "value": b64(b"v")},
                               {"op": "delete", "key": b64(b"k03")}]}),
        Endpoint("POST", "/v1/txn", "write",
                 json={"conditions": [{"key": b64(b"k04"), "present": True}],
                       "ops": [{"op": "delete", "key": b64(b"k04")}]}),
        Endpoint("GET", f"/v1/subscriptions/{SUBSCRIPTION}/events", "write", params=(("prefix", "k"),)),
        Endpoint("GET", "/v1/subscriptions/fresh/events", "write", params=(("from_lsn", "1"),)),
        Endpoint("POST", f"/v1/subscriptions/{SUBSCRIPTION}/ack", "write", json={"lsn": 1}),
        Endpoint("DELETE", f"/v1/subscriptions/{SUBSCRIPTION}", "write"),
        Endpoint("POST", "/v1/admin/sync", "write"),
        Endpoint("PUT", "/v1/kv/k05", "write", params=(("keyspace", "users"), ("ttl", "30")), content=b"v"),
        Endpoint("DELETE", "/v1/keyspaces/users", "write"),
        Endpoint("POST", "/v1/leases", "write", json={"ttl": 10}),
        Endpoint("POST", "/v1/leases/12345/keepalive", "write"),
        Endpoint("DELETE", "/v1/leases/12345", "write"),
        Endpoint("POST", "/v1/subscriptions/created", "write", json={"prefix": b64(b"k"), "from_lsn": 1}),
        # admin
        Endpoint("POST", "/v1/admin/snapshot", "admin"),
        Endpoint("GET", "/v1/stats", "admin"),
        Endpoint("GET", "/metrics", "admin"),
    ]


def call(client: httpx.Client, ep: Endpoint, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """Send ``ep``; the status and, for an error, the parsed JSON body. Streams
    (watch, subscription events) are opened and closed without reading them."""
    with client.stream(ep.method, ep.path, params=list(ep.params), json=ep.json, content=ep.content,
                       headers=headers) as resp:
        if resp.status_code < 400:
            return resp.status_code, None
        body = resp.read()
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, body


def assert_error(status: int, body: Any, want_status: int, want_type: str, what: str) -> None:
    assert status == want_status, f"{what}: {status} {body!r}"
    if what.startswith("HEAD "):
        return  # an answer to HEAD has no body
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), f"{what}: not the error JSON: {body!r}"
    assert body["error"].get("type") == want_type, f"{what}: {body!r}"
    assert isinstance(body["error"].get("message"), str) and body["error"]["message"], f"{what}: {body!r}"


def served_fingerprint(server: ServedStore) -> dict[str, Any]:
    """The store as the admin sees it through the server: bounds, every item,
    snapshots, subscriptions."""
    c = server.session("admin")
    bounds = c.get("/v1/log/bounds")
    scan = c.get("/v1/scan", params={"limit": "10000"})
    snaps = c.get("/v1/snapshots")
    subs = c.get("/v1/subscriptions")
    for r in (bounds, scan, snaps, subs):
        assert r.status_code == 200, (r.request.url, r.status_code, r.text)
    assert scan.json()["after"] is None
    return {
        "last_lsn": bounds.json()["last_lsn"],
        "items": scan.json()["items"],
        "snapshots": [s["lsn"] for s in snaps.json()["snapshots"]],
        "subscriptions": subs.json()["subscriptions"],
    }


# -- one server for the module -----------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServedStore, dict[str, Any]]]:
    """A seeded store served with a read, a write and an admin token; the
    store's fingerprint taken before the server started."""
    root = tmp_path_factory.mktemp("auth")
    store = str(root / "store")
    seed_store(store)
    before = fingerprint(store)
    tokens = {role: new_token(role) for role in ROLES}
    commented = new_token("commented")
    tokens_file = write_tokens(str(root / "tokens"), tokens, extra_lines=(f"# admin {commented}", "   "))
    server = ServedStore(store, tokens_file=tokens_file)
    server.tokens = dict(tokens, commented=commented)
    with server:
        yield server, before
        # At the module's end, whichever test ran last: the server stops cleanly, printed no
        # token (valid, commented out, or a stranger's that a test sent), and the files hold
        # exactly what they held before it started.
        assert server.stop() == 0, server.output()
        printed = server.output()
        for secret in [*server.tokens.values(), *STRANGERS]:
            assert secret not in printed, f"a token is in the server's output:\n{printed}"
        assert fingerprint(server.store) == before


ENDPOINTS = endpoints()
STRANGERS: list[str] = []  # unknown tokens the tests sent: the fixture's end checks the output for them too


def test_the_endpoint_list_covers_every_route_of_the_server():
    """The one look inside: every route the application registers has a
    request in ENDPOINTS, so a new endpoint cannot escape the checks below.
    (The roles are not taken from the server: ENDPOINTS states them.)"""
    from kvstore.server.app import ROUTES

    for r in ROUTES:
        if r.pattern in ("/healthz", "/readyz"):
            continue
        rx = re.compile(re.sub(r"\\\{\w+(\\\*)?\\\}", "[^/]+", re.escape(r.pattern)) + "$")
        assert any(ep.method == r.method and rx.match(ep.path) for ep in ENDPOINTS), f"no test of {r}"


@pytest.mark.parametrize("ep", ENDPOINTS, ids=str)
def test_every_endpoint_refuses_a_request_without_a_valid_token(served, ep):
    server, _ = served
    before = served_fingerprint(server)
    bad_headers = [
        {},                                                        # no Authorization at all
        {"Authorization": f"Bearer {new_token('unknown')}"},       # a token the file does not have
        {"Authorization": f"Bearer {server.tokens['commented']}"},  # one only in a comment
        {"Authorization": f"Basic {server.tokens['admin']}"},       # a real token, another scheme
        {"Authorization": "Bearer"},                                # a scheme without a token
        {"Authorization": f"Bearer {server.tokens['admin']}x"},     # a real token with a byte more
        {"Authorization": f"Bearer {server.tokens['admin'][:-1]}"},  # ... and a byte less
    ]
    for headers in bad_headers:
        status, body = call(server.session(), ep, headers)
        assert_error(status, body, 401, "Unauthorized", f"{ep} with {sorted(headers)}")
    assert served_fingerprint(server) == before


@pytest.mark.parametrize("ep", [e for e in ENDPOINTS if e.role != "read"], ids=str)
def test_a_role_below_the_endpoints_gets_403_and_changes_nothing(served, ep):
    server, _ = served
    before = served_fingerprint(server)
    for role in ROLES:
        if RANK[role] >= RANK[ep.role]:
            continue
        status, body = call(server.session(role), ep)
        assert_error(status, body, 403, "Forbidden", f"{ep} as {role}")
    assert served_fingerprint(server) == before


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_health_needs_no_token(served, path):
    server, _ = served
    with server.client() as c:
        assert c.get(path).status_code == 200


@pytest.mark.parametrize("ep", [e for e in ENDPOINTS if e.role == "read" and e.method == "GET"
                                and "watch" not in e.path and "leases" not in e.path], ids=str)
def test_every_role_reads(served, ep):
    """The refusals above are not the server refusing everything: each role
    that may read does (the write and admin endpoints act for real in
    test_the_right_role_acts, on a server of its own: it changes the store)."""
    server, _ = served
    for role in ROLES:
        status, body = call(server.session(role), ep)
        assert status == 200, (str(ep), role, status, body)


def test_tokens_appear_in_no_answer_or_metric(served):
    """No token (valid, invalid, commented out) is in any error body, in
    /metrics or in /v1/stats. (What the server printed, and the store's files
    after SIGTERM, are checked by the ``served`` fixture at the module's end,
    whatever order the tests ran in.)"""
    server, _ = served
    stranger = new_token("stranger")
    STRANGERS.append(stranger)
    bodies: list[str] = []
    with server.client(token=stranger) as c:
        for ep in ENDPOINTS:
            status, body = call(c, ep)
            assert status == 401
            bodies.append(repr(body))
    with server.client("read") as c:
        for ep in ENDPOINTS:
            if ep.role != "read":
                status, body = call(c, ep)
                assert status == 403
                bodies.append(repr(body))
    with server.client("admin") as c:
        metrics = c.get("/metrics")
        assert metrics.status_code == 200
        stats = c.get("/v1/stats")
        assert stats.status_code == 200
    secrets = [*server.tokens.values(), stranger]
    for text, where in [("\n".join(bodies), "error answers"), (metrics.text, "/metrics"),
                        (stats.text, "/v1/stats")]:
        for secret in secrets:
            assert secret not in text, f"a token is in {where}"


# -- starting: which addresses, which files ---------------------------------------------------------


def test_a_non_loopback_address_without_tokens_is_refused(tmp_path):
    store = str(tmp_path / "store")
    seed_store(store, keys=1)
    proc = run_serve(store, "--listen", "0.0.0.0:0")
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "listening on" not in proc.stdout
    assert "Traceback" not in proc.stderr
    assert "--insecure" in proc.stderr and "--tokens" in proc.stderr, proc.stderr


def test_insecure_says_it_means_it(tmp_path):
    store = str(tmp_path / "store")
    seed_store(store, keys=1)
    with ServedStore(store, listen="0.0.0.0:0", args=("--insecure",)) as server:
        assert server.url.startswith("http://")
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}") as c:
            assert c.get("/v1/kv/k00").content == b"value 0"
        assert server.stop() == 0
        assert "--insecure" in server.stderr.text(), server.output()  # it says so, every start


def test_a_non_loopback_address_with_tokens_but_no_tls_warns(tmp_path):
    store = str(tmp_path / "store")
    seed_store(store, keys=1)
    tokens = {"read": new_token("read")}
    with ServedStore(store, tokens=tokens, listen="0.0.0.0:0") as server:
        with server.client("read", base_url=f"http://127.0.0.1:{server.port}") as c:
            assert c.get("/v1/kv/k00").content == b"value 0"
        assert server.stop() == 0
        assert "tls" in server.stderr.text().lower(), server.output()
        assert tokens["read"] not in server.output()


@pytest.mark.parametrize("line", ["superuser {token}", "write {token} extra"])
def test_a_tokens_file_line_it_cannot_read_is_refused_without_printing_the_token(tmp_path, line):
    store = str(tmp_path / "store")
    seed_store(store, keys=1)
    token = new_token("x")
    tokens_file = write_tokens(str(tmp_path / "tokens"), {"admin": new_token("admin")},
                               extra_lines=(line.format(token=token),))
    proc = run_serve(store, "--tokens", tokens_file)
    assert proc.returncode != 0 and "listening on" not in proc.stdout, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    err = proc.stderr
    assert "tokens" in err and (":4" in err or "line 4" in err), err  # the file and the line
    assert token not in proc.stdout + proc.stderr


def test_a_missing_tokens_file_is_refused(tmp_path):
    store = str(tmp_path / "store")
    seed_store(store, keys=1)
    proc = run_serve(store, "--tokens", str(tmp_path / "no-such-file"))
    assert proc.returncode != 0 and "listening on" not in proc.stdout
    assert "Traceback" not in proc.stderr and "no-such-file" in proc.stderr, proc.stderr


# -- TLS ---------------------------------------------------------------------------------------


def test_tls_serves_https_and_plain_http_gets_nothing_done(tmp_path):
    store = str(tmp_path / "store")
    seed_store(store, keys=2)
    before = fingerprint(store)
    tls = Tls(str(tmp_path))
    tokens = {role: new_token(role) for role in ROLES}
    with ServedStore(store, tokens=tokens, tls=tls) as server:
        assert server.url.startswith("https://"), server.url
        with server.client("write") as c:
            r = c.get("/v1/kv/k01")
            assert r.status_code == 200 and r.content == b"value 1"
            assert r.headers["walkv-lsn"].isdigit()
        # An unverified client still cannot talk plain HTTP to the TLS port.
        plain = f"http://{server.host}:{server.port}"
        with httpx.Client(base_url=plain, headers={"Authorization": f"Bearer {tokens['write']}"},
                          timeout=10) as c:
            try:
                r = c.put("/v1/kv/plain", content=b"must not land")
            except httpx.TransportError:
                pass
            else:
                assert r.status_code >= 400, r.text
        # A client that does not trust the CA is refused by its own check.
        with httpx.Client(base_url=server.url, timeout=10) as c, pytest.raises(httpx.ConnectError):
            c.get("/healthz")
        with server.client("write") as c:  # still serving after the plain-HTTP attempt
            assert c.get("/v1/kv/plain").status_code == 404
        assert server.stop() == 0
    assert fingerprint(store) == before


def test_client_certificates_are_required_with_a_client_ca(tmp_path):
    """``--tls-client-ca``: only a client presenting a certificate that CA
    signed gets an answer; one without a certificate, or with one from
    another CA (here: the CA of the server's own certificate), gets none."""
    import trustme

    store = str(tmp_path / "store")
    seed_store(store, keys=2)
    before = fingerprint(store)
    tls = Tls(str(tmp_path))
    clients_ca = trustme.CA()
    clients_ca_file = str(tmp_path / "clients-ca.pem")
    clients_ca.cert_pem.write_to_path(clients_ca_file)
    with ServedStore(store, tls=tls, args=("--tls-client-ca", clients_ca_file)) as server:
        no_cert = tls.client_context()
        foreign = tls.client_context()
        tls.ca.issue_cert("intruder@example.org").configure_cert(foreign)
        for ctx in (no_cert, foreign):
            with httpx.Client(base_url=server.url, verify=ctx, timeout=10) as c, \
                    pytest.raises(httpx.TransportError):
                c.put("/v1/kv/k00", content=b"overwritten")
        trusted = tls.client_context()
        clients_ca.issue_cert("client@example.org").configure_cert(trusted)
        with httpx.Client(base_url=server.url, verify=trusted, timeout=10) as c:
            assert c.get("/v1/kv/k00").content == b"value 0"
        assert server.stop() == 0
    assert fingerprint(store) == before


# -- the right role acts (last: it changes the store) ---------------------------------------------


def test_the_right_role_acts(tmp_path):
    """Each write/admin endpoint with its own role (and the roles above it) is
    not refused: the 403s above are about roles, not a broken endpoint."""
    store = str(tmp_path / "store")
    seed_store(store)
    tokens = {role: new_token(role) for role in ROLES}
    with ServedStore(store, tokens=tokens) as server:
        for ep in ENDPOINTS:
            for role in ROLES:
                if RANK[role] < RANK[ep.role]:
                    continue
                status, body = call(server.session(role), ep)
                assert status < 400 or status in (404, 409), (str(ep), role, status, body)
        assert server.stop() == 0
