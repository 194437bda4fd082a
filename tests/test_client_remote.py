"""The client does what the embedded store does (issue 33, items 5, 6, 12),
each test run against both (the ``open_api`` fixture: the embedded store,
and ``kvstore.connect`` to a server of it):

* keyspaces, TTLs and leases, with the same results and the same errors;
* the README's keyspace and subscription examples, as written, against both;
* an unbounded ``delete_range`` is a change with no end (null over HTTP);
* what the client cannot do raises ``NotSupportedRemotelyError`` naming the
  method (never an AttributeError), and the README's table names it;
* the client's errors are ``kvstore``'s names.
"""

from __future__ import annotations

import base64
import json
import re

import httpx
import pytest

import kvstore
from kvstore.client import wire
from kvstore.client.remote import RemoteStore
from tests.served import ServerThread, open_store
from tests.test_cli_readme import _python_blocks, _readme


def _error(call):
    """``(type, message)`` of what ``call()`` raises."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - compared across the two kinds
        return type(exc), str(exc)
    raise AssertionError("no error")


def test_keyspaces_as_embedded(tmp_path, open_api):
    with open_api(tmp_path / "s") as db:
        users = db.keyspace("users")
        users.put(b"1", b"Ada")
        with db.batch() as b:
            b.put(b"1", b"order", keyspace="orders")
            b.put(b"1", b"Ada L.", keyspace="users")
            b.put(b"1", b"default")
        assert db.keyspaces() == ["orders", "users"]
        assert (users.get(b"1"), db.get(b"1"), db.keyspace("orders")[b"1"]) == (b"Ada L.", b"default", b"order")
        assert users.get_many([b"1", b"2"]) == [b"Ada L.", None] and len(users) == 1
        users.update({b"2": b"Grace", b"3": b"Edsger"})
        assert list(users.scan(start=b"2")) == [(b"2", b"Grace"), (b"3", b"Edsger")]
        with db.transaction() as t:
            t.require(b"1", equals=b"order", keyspace="orders")
            t.require(b"9", absent=True, keyspace="users")
            t.put(b"9", b"new", keyspace="users")
        assert t.succeeded and users.get(b"9") == b"new"
        with db.transaction() as t:
            t.require(b"1", equals=b"Ada L.", keyspace="users")
            t.require(b"1", equals=b"not it", keyspace="orders")
            t.delete(b"9", keyspace="users")
        assert (t.succeeded, t.failed_index, t.failed_condition.keyspace) == (False, 1, "orders")
        assert users.compare_and_set(b"9", b"new", b"newer") and not users.compare_and_set(b"9", b"new", b"x")
        assert users.delete_if(b"9", b"newer") and users.get(b"9") is None
        users.delete_range(b"2", None)
        assert list(users.scan()) == [(b"1", b"Ada L.")]
        lsn = db.drop_keyspace("orders")
        assert db.keyspaces() == ["users"] and db.keyspace("orders").get(b"1") is None
        changes = [c for c in db.watch(from_lsn=lsn, timeout=0.2, keyspace=None)]
        assert [(c.op, c.key, c.end_key, c.keyspace) for c in changes] == [("delete_range", b"", None, "orders")]
        for bad in (lambda: db.keyspace(""), lambda: db.keyspace("no/slash"), lambda: db.keyspace(7),
                    lambda: db.drop_keyspace("__x")):
            assert _error(bad)[0] in (ValueError, TypeError)


def test_ttls_and_leases_as_embedded(tmp_path, open_api):
    with open_api(tmp_path / "s") as db:
        db.put(b"session", b"ada", ttl=30)
        assert 0 < db.ttl(b"session") <= 30 and db.ttl(b"nope") is None
        db.keyspace("users").put(b"s", b"v", ttl=60)
        assert 30 < db.keyspace("users").ttl(b"s") <= 60
        lease = db.grant(10)
        assert isinstance(lease, kvstore.Lease) and lease.granted_ttl == 10
        db.put(b"lock", b"me", lease=lease)
        with db.batch() as b:
            b.put(b"a", b"1", lease=lease)
            b.put(b"b", b"2", ttl=100, keyspace="users")
        assert 0 < lease.ttl() <= 10 and lease.keepalive() == 10
        assert db.lease(lease.id).id == lease.id
        assert 60 < db.keyspace("users").ttl(b"b") <= 100
        db.revoke(lease)
        assert db.get(b"lock") is None and db.get(b"a") is None and lease.ttl() is None
        for call in (lambda: db.put(b"x", b"y", lease=lease), lambda: lease.keepalive(), lambda: db.revoke(lease),
                     lambda: db.lease(lease.id)):
            kind, _ = _error(call)
            assert kind is kvstore.LeaseNotFoundError
        try:
            with db.transaction() as t:
                t.put(b"x", b"y", lease=lease)
        except kvstore.LeaseNotFoundError as exc:
            assert exc.lease_id == lease.id
        assert db.get(b"x") is None
        for bad in (lambda: db.put(b"k", b"v", ttl=-1), lambda: db.put(b"k", b"v", ttl=1, lease=lease),
                    lambda: db.grant(0), lambda: db.put(b"k", b"v", lease="7"), lambda: db.put(b"k", b"v", ttl="5")):
            assert _error(bad)[0] in (ValueError, TypeError), bad
        assert db.get(b"k") is None


def test_the_same_errors_embedded_and_over_http(tmp_path):
    """Each bad call raises the same class with the same message both ways
    (the client checks with the embedded API's own code)."""
    bad = [lambda db: db.put(b"k", b"v", ttl="5"), lambda db: db.put(b"k", b"v", ttl=1, lease=3),
           lambda db: db.put(b"", b"v"), lambda db: db.put(b"k", "text"), lambda db: db.keyspace(""),
           lambda db: db.keyspace("a b"), lambda db: db.put(b"k", b"v", lease=True),
           lambda db: db.delete_range(b"a", 3), lambda db: db.grant("10")]
    seen = {}
    for kind in ("embedded", "http"):
        with open_store(kind, tmp_path / kind) as db:
            seen[kind] = [_error(lambda: call(db)) for call in bad]
    assert seen["embedded"] == [(t, m.replace(str(tmp_path / "http"), str(tmp_path / "embedded")))
                                for t, m in seen["http"]]


def _readme_block(marker: str) -> str:
    found = [b.code for b in _python_blocks() if marker in b.code]
    assert len(found) == 1, marker
    return found[0]


@pytest.mark.parametrize("kind", ["embedded", "http"])
@pytest.mark.parametrize("marker,opened", [
    ('db.subscribe("billing"', 'kvstore.open("billing-store")'),
    ('db.keyspace("users")', 'kvstore.open("keyspaces-store")'),
])
def test_readme_examples_run_against_a_server_as_embedded(tmp_path, monkeypatch, kind, marker, opened):
    """Issue 33 item 6: right after ``subscribe(name, from_lsn=1)`` the
    client listed no subscription and its loop received nothing. The README's
    block runs as written; only the open call becomes the client's."""
    code = _readme_block(marker)
    assert opened in code
    monkeypatch.chdir(tmp_path)
    ns = {"open_store": open_store}
    exec(compile(code.replace(opened, f"open_store({kind!r}, {opened.split('(')[1][:-1]})"), "README.md", "exec"),
         ns)  # noqa: S102 - our README


def test_a_subscription_exists_once_subscribe_returns(tmp_path, open_api):
    with open_api(tmp_path / "s") as db:
        db.subscribe("audit", prefix=b"k", from_lsn=1)
        assert [(s.name, s.acked_lsn) for s in db.subscriptions()] == [("audit", 0)]
        with pytest.raises(ValueError, match="drop it to change"):
            db.subscribe("audit", prefix=b"other")
        assert db.drop_subscription("audit") and not db.drop_subscription("audit")


def test_an_unbounded_delete_range_has_no_end_in_watch_and_over_http(tmp_path, open_api):
    with open_api(tmp_path / "s") as db:
        db.put(b"a", b"1")
        lsn = db.delete_range(None, None)
        db.delete_range(b"a", None)
        db.delete_range(None, b"m")
        changes = [(c.op, c.key, c.end_key) for c in db.watch(from_lsn=lsn, timeout=0.2)]
        assert changes == [("delete_range", b"", None), ("delete_range", b"a", None), ("delete_range", b"", b"m")]


def test_the_wire_shows_an_unbounded_range_as_null(tmp_path):
    with ServerThread(tmp_path / "s") as server:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            lsn = c.post("/v1/delete_range", json={"start": None, "end": None}).json()["lsn"]
            r = c.get("/v1/watch", params={"from_lsn": str(lsn), "timeout": "0.1", "format": "ndjson"})
    doc = json.loads(r.text.splitlines()[0])
    assert (doc["op"], doc["key"], doc["end_key"], doc["keyspace"]) == ("delete_range", None, None, "")


def test_what_the_client_cannot_do_is_a_typed_error_naming_it(tmp_path):
    """Every public name of KVStore exists on the client (no AttributeError);
    those it cannot serve raise NotSupportedRemotelyError naming the method,
    and the README's table lists each."""
    readme = _readme()
    table = readme[readme.index("What `kvstore.connect(url)` can and cannot do"):]
    table = table[:table.index("\n\n", table.index("| the embedded API"))]
    unsupported = {"view": (), "write": (b"x",), "sweep_expired": (), "list_snapshots": (),
                   "wait_for_snapshots": (), "flush_archive": (), "start_timeline": (), "write_group": ([],),
                   "committed_version": ("app",), "read_at": (lambda: None,)}
    with ServerThread(tmp_path / "s") as server, kvstore.connect(server.url) as db:
        public = [n for n in dir(kvstore.KVStore) if not n.startswith("_") and n not in ("path", "store")]
        missing = [n for n in public if not hasattr(RemoteStore, n)]
        assert not missing, missing
        with pytest.raises(kvstore.NotSupportedRemotelyError) as caught:
            db.following.refuse_writes(None)
        assert caught.value.method == "following" and "`following`" in table
        for name, args in unsupported.items():
            with pytest.raises(kvstore.NotSupportedRemotelyError) as caught:
                getattr(db, name)(*args)
            assert caught.value.method.startswith(name) and isinstance(caught.value, NotImplementedError)
            assert f"`{name}(" in table, name
        with pytest.raises(kvstore.NotSupportedRemotelyError):
            db.keyspace("users").view()


def test_the_clients_errors_are_kvstores_names():
    for name in ("Unauthorized", "Forbidden", "ServerUnavailable", "ConditionFailed", "NotSupportedRemotelyError"):
        assert getattr(kvstore, name) is getattr(wire, name) and name in kvstore.__all__
        assert issubclass(getattr(kvstore, name), kvstore.WalkvError)


def test_the_wire_carries_keyspace_ttl_and_lease_errors_as_their_classes():
    err = kvstore.LeaseNotFoundError("lease 7 is not alive", lease_id=7)
    status, body = wire.error_body(err)
    back = wire.error_from_json(status, body["error"])
    assert (status, type(back), back.lease_id) == (404, kvstore.LeaseNotFoundError, 7)
    status, body = wire.error_body(kvstore.KeyspaceLimitError("too many"))
    assert (status, type(wire.error_from_json(status, body["error"]))) == (409, kvstore.KeyspaceLimitError)
    assert re.search(r"an admin token", _forbidden_message())


def _forbidden_message() -> str:
    from kvstore.server.auth import ADMIN, Tokens

    try:
        Tokens([("read", "r")]).check("Bearer r", ADMIN)
    except kvstore.Forbidden as exc:
        return str(exc)
    raise AssertionError("not refused")


def test_serve_help_is_plain_text():
    from tests.test_cli import walkv

    text = walkv("serve", "--help").stdout
    assert "``" not in text and ":mod:" not in text and ":attr:" not in text, text
    assert "listening on" in text and "pip install 'walkv[server]'" in text


def test_get_many_on_the_wire_answers_in_key_order(tmp_path):
    with ServerThread(tmp_path / "s") as server, kvstore.connect(server.url) as db:
        db.update({b"a": b"1", b"c": b"3"})
        with httpx.Client(base_url=server.url, timeout=30) as c:
            doc = c.post("/v1/get_many", json={"keys": [base64.b64encode(k).decode() for k in (b"c", b"b", b"a")]})
        assert doc.json()["values"] == [base64.b64encode(b"3").decode(), None, base64.b64encode(b"1").decode()]
