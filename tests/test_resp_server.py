"""The RESP face through redis-py: authentication and roles, read-only
stores, databases as keyspaces, MULTI/EXEC as one log entry, WATCH, pipelines
that read their own writes, read-modify-writes decided in log order under
concurrency, SCAN across writes, the server commands, and that RESP's writes
are the store's like any other (watch sees them)."""

from __future__ import annotations

import socket
import threading

import pytest

import kvstore
from kvstore.server.auth import Tokens
from kvstore.server.resp import RespLimits
from tests.resp_fixture import InProcess

redis = pytest.importorskip("redis")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = InProcess(str(tmp_path_factory.mktemp("resp") / "store"))
    yield s
    s.close()


@pytest.fixture
def r(server):
    c = server.client()
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def r3(server):
    c = server.client(protocol=3)
    yield c
    c.close()


# -- authentication and roles ----------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    tokens = Tokens([("read", "r3ad"), ("write", "wr1te"), ("admin", "adm1n")])
    s = InProcess(str(tmp_path_factory.mktemp("guarded") / "store"), tokens=tokens)
    yield s
    s.close()


def test_commands_need_a_token_then_its_role(guarded):
    anon = guarded.client(protocol=2)  # (redis-py's default, RESP3, would say HELLO first: NOAUTH too)
    with pytest.raises(redis.exceptions.AuthenticationError, match="Authentication required"):
        anon.get("k")
    with pytest.raises(redis.exceptions.AuthenticationError, match="Authentication required"):
        anon.ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        anon.execute_command("AUTH", "wrong")
    with pytest.raises(redis.exceptions.AuthenticationError):
        anon.execute_command("AUTH", "someone", "wr1te")  # only the default user
    reader = guarded.client(password="r3ad")
    assert reader.get("k") is None
    with pytest.raises(redis.exceptions.NoPermissionError, match="'set' command"):
        reader.set("k", "v")
    writer = guarded.client(username="default", password="wr1te")
    assert writer.set("k", "v") is True
    with pytest.raises(redis.exceptions.NoPermissionError):
        writer.config_get("*")
    assert guarded.client(password="adm1n").config_get("appendonly") == {"appendonly": "yes"}
    hello = guarded.client(protocol=3, username="default", password="wr1te")  # HELLO 3 AUTH default TOKEN
    assert hello.get("k") == b"v"
    for c in (anon, reader, writer, hello):
        c.close()


def test_auth_without_tokens_is_an_error(r):
    with pytest.raises(redis.exceptions.AuthenticationError, match="without any password configured"):
        r.execute_command("AUTH", "x")


# -- what a write means ------------------------------------------------------------------


def test_writes_are_the_stores_and_watch_sees_them(server, r):
    with server.store.watch(prefix=b"w:") as changes:
        r.set("w:1", "a")
        r.mset({"w:2": "b", "w:3": "c"})
        r.incr("w:n")
        got = [next(changes) for _ in range(4)]
    assert [(c.key, c.value) for c in got] == [(b"w:1", b"a"), (b"w:2", b"b"), (b"w:3", b"c"), (b"w:n", b"1")]
    assert server.store.get(b"w:n") == b"1"
    server.store.put(b"w:4", b"embedded")
    assert r.get("w:4") == b"embedded"


def test_select_is_a_keyspace_and_flushdb_drops_it(server, r):
    r.execute_command("SELECT", "3")
    r.set("k", "three")
    assert server.store.keyspace("3").get(b"k") == b"three"
    assert server.store.get(b"k") is None
    r.execute_command("SELECT", "0")
    r.set("k", "zero")
    r.execute_command("SELECT", "3")
    r.flushdb()
    assert server.store.keyspace("3").get(b"k") is None and server.store.get(b"k") == b"zero"
    with pytest.raises(redis.exceptions.ResponseError, match="DB index is out of range"):
        r.execute_command("SELECT", "16")


def test_exec_is_one_log_entry(server, r):
    before = server.store.last_lsn
    with r.pipeline(transaction=True) as p:
        p.set("a", "1").incr("a").append("b", "x").get("a")
        assert p.execute() == [True, 2, 1, b"2"]
    assert server.store.last_lsn == before + 1


def test_pipelines_read_their_own_writes(r):
    with r.pipeline(transaction=False) as p:
        p.set("p", "1").get("p").incr("p").get("p").delete("p").exists("p")
        assert p.execute() == [True, b"1", 2, b"2", 1, 0]


def test_counters_from_many_clients_are_decided_in_log_order(server):
    def work():
        c = server.client()
        for _ in range(40):
            c.incr("shared")
        with c.pipeline(transaction=False) as p:
            for _ in range(40):
                p.incrby("shared", 2)
            p.execute()
        c.close()

    server.store.delete(b"shared")
    threads = [threading.Thread(target=work) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert server.store.get(b"shared") == b"%d" % (12 * 40 * 3)


def test_incr_keeps_the_ttl_a_pipelined_set_gave(r):
    with r.pipeline(transaction=False) as p:
        p.set("limited", "5", ex=100).incr("limited").ttl("limited")
        ok, n, ttl = p.execute()
    assert (ok, n) == (True, 6) and 95 <= ttl <= 100


# -- WATCH -------------------------------------------------------------------------------------


def test_watch_aborts_when_the_value_changed(server, r):
    r.set("balance", "10")
    other = server.client()
    with r.pipeline() as p:
        p.watch("balance")
        assert p.get("balance") == b"10"
        other.set("balance", "7")
        p.multi()
        p.set("balance", "0")
        with pytest.raises(redis.exceptions.WatchError):
            p.execute()
    assert r.get("balance") == b"7"
    with r.pipeline() as p:  # unchanged: it runs
        p.watch("balance")
        p.multi()
        p.set("balance", "1")
        assert p.execute() == [True]
    other.close()


def test_watch_aborts_when_this_connection_read_another_value(server, r):
    """A -> B -> A between WATCH and EXEC: the read of B on this connection aborts EXEC."""
    r.set("x", "A")
    other = server.client()
    with r.pipeline() as p:
        p.watch("x")
        other.set("x", "B")
        assert p.get("x") == b"B"
        other.set("x", "A")
        p.multi()
        p.set("x", "C")
        with pytest.raises(redis.exceptions.WatchError):
            p.execute()
    other.close()


def test_a_write_of_the_same_value_does_not_abort(server, r):
    """What differs from Redis, by design (kvstore.server.resp.transactions)."""
    r.set("same", "v")
    other = server.client()
    with r.pipeline() as p:
        p.watch("same")
        other.set("same", "v")
        p.multi()
        p.set("same", "w")
        assert p.execute() == [True]
    other.close()


def test_exec_errors(r):
    with pytest.raises(redis.exceptions.ResponseError, match="EXEC without MULTI"):
        r.execute_command("EXEC")
    with pytest.raises(redis.exceptions.ResponseError, match="DISCARD without MULTI"):
        r.execute_command("DISCARD")
    with r.pipeline() as p:
        p.set("a", "1").keys("*")
        with pytest.raises(redis.exceptions.ResponseError, match="KEYS is not allowed in MULTI"):
            p.execute()  # (redis-py raises the queued error; EXEC answered EXECABORT)
    assert r.get("a") is None


# -- reads across writes ------------------------------------------------------------------------


def test_scan_returns_every_key_present_throughout_once(server, r):
    keep = {b"s:%03d" % i for i in range(0, 200, 2)}
    r.mset({k: b"x" for k in keep})
    cursor, seen = 0, []
    churn = 0
    while True:
        cursor, batch = r.scan(cursor, match="s:*", count=7)
        seen += batch
        r.set(b"s:%03d" % (2 * churn + 1), b"y")  # new keys between the kept ones
        churn += 1
        if cursor == 0:
            break
    assert keep <= set(seen) and len(seen) == len(set(seen))


def test_keys_and_dbsize(r):
    r.mset({"k:1": 1, "k:2": 2, "other": 3})
    assert sorted(r.keys("k:*")) == [b"k:1", b"k:2"] and r.dbsize() == 3
    assert r.type("k:1") == b"string" and r.type("none") == b"none"


# -- the server commands ----------------------------------------------------------------------


def test_server_commands(server, r, r3):
    r.set("i", "1", ex=100)
    info = r.info()
    assert info["redis_version"] == "7.0.0" and info["role"] == "master"
    assert info["walkv_durable_lsn"] == server.store.durable_lsn or info["walkv_durable_lsn"] > 0
    assert info["db0"]["keys"] == 1 and info["db0"]["expires"] == 1
    assert r.config_get("appendfsync") == {"appendfsync": "always"}
    assert r.execute_command("WAIT", 1, 0) == 0
    assert r.client_setname("me") is True and r.client_getname() == "me"
    assert isinstance(r.client_id(), int)
    assert r.command_count() >= 60 and "get" in r.command()
    assert r.lastsave() is not None
    assert r.save() is True and server.store.list_snapshots()
    assert r3.get("i") == b"1" and r3.execute_command("HELLO", 3)[b"proto"] == 3


# -- read-only stores -----------------------------------------------------------------------


def test_a_read_only_store_answers_writes_with_readonly(tmp_path):
    path = str(tmp_path / "s")
    with kvstore.open(path) as db:
        db.put(b"k", b"v")
    if True:
        ro = InProcess(path, readonly=True)
        try:
            c = ro.client()
            assert c.get("k") == b"v"
            for call in (lambda: c.set("k", "x"), lambda: c.incr("n"), lambda: c.delete("k")):
                with pytest.raises(redis.exceptions.ReadOnlyError):
                    call()
            with c.pipeline() as p:
                p.get("k").exists("k")
                assert p.execute() == [b"v", 1]
            assert c.info("replication")["role"] == "slave"
            c.close()
        finally:
            ro.close()
    with kvstore.open(path, readonly=True) as db:
        assert db.get(b"k") == b"v" and db.get(b"n") is None


def test_limits(tmp_path):
    limits = RespLimits(max_request_bytes=4096, max_multi_commands=3, max_reply_bytes=64, max_connections=2,
                        max_args=9)
    s = InProcess(str(tmp_path / "s"), limits=limits)
    try:
        c = s.client()
        with pytest.raises((redis.exceptions.ResponseError, redis.exceptions.ConnectionError)):
            c.set("big", "x" * 1_000_000)  # answered with an error, and closed
        c = s.client()
        assert c.mset({f"a{n}": n for n in range(4)}) is True  # 9 arguments
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as raw:  # an error, then closed
            raw.sendall(b"*11\r\n$4\r\nMSET\r\n" + b"$1\r\nb\r\n" * 10 + b"*1\r\n$4\r\nPING\r\n")
            got = b""
            while chunk := raw.recv(4096):
                got += chunk
        assert got == b"-ERR Protocol error: a command of 11 arguments, over this server's limit of 9\r\n"
        with c.pipeline() as p:
            for n in range(4):
                p.set(f"m{n}", n)
            with pytest.raises(redis.exceptions.ResponseError, match="3 commands, its limit"):
                p.execute()  # EXECABORT
        for n in range(0, 20, 4):
            c.mset({f"key{n + i}": n + i for i in range(4)})
        with pytest.raises(redis.exceptions.ResponseError, match="use SCAN"):
            c.keys("*")
        others = [s.client(), s.client()]
        others[0].ping()
        with pytest.raises(redis.exceptions.ConnectionError, match="max number of clients"):
            others[1].ping()
        for o in others + [c]:
            o.close()
        assert s.store.get(b"big") is None and s.store.get(b"m0") is None and s.store.get(b"b0") is None
    finally:
        s.close()
