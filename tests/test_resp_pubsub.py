"""Pub/sub and keyspace notifications on the RESP face, against the model
(a real ``redis-server --notify-keyspace-events KEA``): the same generated
command sequences to both, the notifications a pattern subscriber receives
compared one by one; the protocol's frames (subscribe confirmations, PING
and errors in subscribed mode, RESP3 push frames) compared byte for byte;
notifications of writes through the embedded API and of expiry; a
subscriber that never reads is dropped at its bound while others go on.

Normalised only where walkv differs by design: ``expired`` events are
left out of the differential test (Redis expires lazily on access and 10
times a second; walkv's sweeper runs every ``sweep_interval``), and have a
test of their own.
"""

from __future__ import annotations

import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.server.resp import RespLimits
from tests.resp_fixture import InProcess, start_redis
from tests.test_resp_model import STEP, _run

redis = pytest.importorskip("redis")

END = b"__end__"
PATTERN = "__key*__:*"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    proc, port = start_redis(str(tmp_path_factory.mktemp("redis")), "--notify-keyspace-events", "KEA")
    yield port
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def walkv(tmp_path_factory):
    server = InProcess(str(tmp_path_factory.mktemp("walkv") / "store"))  # sync="always": watchers see durable writes
    yield server
    server.close()


def notifications_until_end(pubsub, seconds: float = 30) -> list[tuple[bytes, bytes]]:
    """(channel, message) of every notification up to the END key's ``set``, ``expired`` left out."""
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = pubsub.get_message(timeout=1)
        if m is None or m["type"] != "pmessage":
            continue
        if m["channel"] == b"__keyspace@0__:" + END:
            return got
        if m["data"] != b"expired" and not m["channel"].endswith(b":expired"):
            got.append((m["channel"], m["data"]))
    raise AssertionError(f"no notification of {END!r} within {seconds} s; got {got[-6:]}")


@pytest.mark.parametrize("protocol", [2, 3])
def test_notifications_are_redis_s(walkv, reference, protocol):
    ours = walkv.client(protocol=protocol)
    theirs = redis.Redis(host="127.0.0.1", port=reference, protocol=protocol, socket_timeout=30)
    subs = []
    for c in (ours, theirs):
        subs.append(psubscribed(c, PATTERN))

    @settings(max_examples=25, deadline=None)
    @given(st.lists(STEP, min_size=1, max_size=15))
    def check(steps):
        for c in (ours, theirs):
            c.execute_command("SELECT", "0")
            c.execute_command("FLUSHALL")
        for step in steps:
            _run(ours, step)
            _run(theirs, step)
        for c in (ours, theirs):
            c.execute_command("SELECT", "0")
            c.set(END, "1")
        a, b = (notifications_until_end(p) for p in subs)
        assert a == b, f"{steps}: walkv {a}, redis {b}"

    try:
        check()
    finally:
        for p in subs:
            p.close()
        ours.close()
        theirs.close()


def raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)


def read_for(sock: socket.socket, quiet: float = 0.1) -> bytes:
    """What arrives: the first bytes (every step of the scripts below is
    answered), waited for up to 5 s, then what follows until ``quiet``
    seconds pass with nothing more."""
    sock.settimeout(5)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
            sock.settimeout(quiet)
    except TimeoutError:
        pass
    return got


SCRIPT = [
    (b"SUBSCRIBE", b"news", b"sport", b"news"), (b"PSUBSCRIBE", b"n*"), (b"PING",), (b"PING", b"hi"),
    (b"GET", b"k"), (b"CONFIG", b"GET", b"databases"), (b"PUBLISH", b"x", b"y"), (b"SUBSCRIBE",),
    (b"UNSUBSCRIBE", b"sport", b"nope"), (b"UNSUBSCRIBE",), (b"UNSUBSCRIBE",), (b"PUNSUBSCRIBE",),
    (b"PUNSUBSCRIBE",), (b"PING",), (b"GET", b"k"),
]


@pytest.mark.parametrize("protocol", [b"2", b"3"])
def test_the_frames_of_subscribed_mode_are_redis_s(walkv, reference, protocol):
    answers = []
    for port in (walkv.port, reference):
        sub, pub = raw(port), raw(port)
        sub.sendall(command(b"HELLO", protocol))
        read_for(sub)
        got = []
        for step in SCRIPT:
            sub.sendall(command(*step))
            got.append((step, read_for(sub)))
            if step[0] == b"PSUBSCRIBE":  # a message to a channel and a pattern, in between
                pub.sendall(command(b"PUBLISH", b"news", b"extra!"))
                got.append(((b"PUBLISH",), read_for(pub) + b" / " + read_for(sub)))
        answers.append(got)
        sub.close()
        pub.close()
    for ours, theirs in zip(*answers):
        assert ours == theirs


def test_pubsub_numbers_are_redis_s(walkv, reference):
    answers = []
    for port in (walkv.port, reference):
        subs = [redis.Redis(host="127.0.0.1", port=port).pubsub() for _ in range(2)]
        subs[0].subscribe("a", "b")
        subs[1].subscribe("a")
        subs[1].psubscribe("x*")
        for p in subs:
            while p.get_message(timeout=0.5) is not None:
                pass
        c = redis.Redis(host="127.0.0.1", port=port)
        answers.append([sorted(c.pubsub_channels()), sorted(c.pubsub_channels("a*")),
                        c.pubsub_numsub("a", "b", "c", "a"), c.pubsub_numpat(), c.publish("a", "m"),
                        c.publish("xy", "m"), c.publish("zz", "m")])
        for p in subs:
            p.close()
        c.close()
    assert answers[0] == answers[1]


def test_notify_keyspace_events_is_redis_s(walkv, reference):
    values = ["K", "E", "KE$", "Kg", "gE$x", "AKE", "KEA", "Ex", "", "KEAm", "KEAn", "Kq", "A"]
    answers = []
    for port in (walkv.port, reference):
        c = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
        got = []
        for value in values:
            try:
                c.config_set("notify-keyspace-events", value)
                got.append(c.config_get("notify-keyspace-events"))
            except redis.exceptions.ResponseError as exc:
                got.append(str(exc))
        c.config_set("notify-keyspace-events", "KEA")
        answers.append(got)
        c.close()
    assert answers[0] == answers[1]


def test_the_flags_choose_what_is_delivered(walkv):
    c = walkv.client(decode_responses=True)
    p = psubscribed(c, "__key*")
    try:
        for flags, expected in [("K$", [("__keyspace@0__:f", "set")]), ("Eg", [("__keyevent@0__:del", "f")]),
                                ("E$", [("__keyevent@0__:set", "f")])]:
            c.config_set("notify-keyspace-events", flags)
            c.set("f", "1")
            c.delete("f")
            c.config_set("notify-keyspace-events", "KEA")
            c.set("end", "1")
            got = []
            while (m := p.get_message(timeout=5)) is not None and m["channel"] != "__keyevent@0__:set" \
                    or m["data"] != "end":  # (its keyspace message came before)
                if m is not None and m["type"] == "pmessage":
                    got.append((m["channel"], m["data"]))
            assert got == [*expected, ("__keyspace@0__:end", "set")]
    finally:
        c.config_set("notify-keyspace-events", "KEA")
        p.close()
        c.close()


def psubscribed(client, pattern: str):
    """``client``'s PubSub, subscribed to ``pattern`` (its confirmation read)."""
    p = client.pubsub()
    p.psubscribe(pattern)
    assert p.get_message(timeout=5)["type"] == "psubscribe"
    return p


def messages(pubsub, n: int, seconds: float = 30) -> list[tuple[bytes, bytes]]:
    got: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        m = pubsub.get_message(timeout=1)
        if m is not None and m["type"] in ("message", "pmessage"):
            got.append((m["channel"], m["data"]))
    return got


def test_writes_of_the_embedded_api_and_expiry_are_notified(walkv):
    c = walkv.client()
    p = psubscribed(c, "__keyspace@*__:emb*")
    try:
        walkv.store.put(b"emb:1", b"x")
        walkv.store.keyspace("4").put(b"emb:2", b"y")
        walkv.store.delete(b"emb:1")
        assert messages(p, 3) == [(b"__keyspace@0__:emb:1", b"set"), (b"__keyspace@4__:emb:2", b"set"),
                                  (b"__keyspace@0__:emb:1", b"del")]
        c.set("emb:3", "z", px=50)  # the sweeper deletes it: "expired"
        assert messages(p, 3, 60) == [(b"__keyspace@0__:emb:3", b"set"), (b"__keyspace@0__:emb:3", b"expire"),
                                      (b"__keyspace@0__:emb:3", b"expired")]
    finally:
        p.close()
        c.close()


def test_a_transaction_notifies_each_command_in_order(walkv):
    c = walkv.client()
    p = psubscribed(c, "__keyevent@*")
    try:
        with c.pipeline(transaction=True) as t:
            t.set("t1", "1").incrby("t1", 4).execute_command("SELECT", "2").append("t2", "x").rename("t2", "t3")
            t.execute()
        assert messages(p, 5) == [(b"__keyevent@0__:set", b"t1"), (b"__keyevent@0__:incrby", b"t1"),
                                  (b"__keyevent@2__:append", b"t2"), (b"__keyevent@2__:rename_from", b"t2"),
                                  (b"__keyevent@2__:rename_to", b"t3")]
    finally:
        p.close()
        c.close()


def test_the_feed_runs_only_while_someone_is_subscribed(tmp_path):
    s = InProcess(str(tmp_path / "s"))
    try:
        hub, pubsub = s.store._changes.hub, s.server.served.pubsub
        c = s.client()
        p = c.pubsub()
        p.subscribe("plain")  # a channel no write publishes on: no feed
        p.get_message(timeout=5)
        assert pubsub.feed is None and not hub.watchers
        p.psubscribe("*")
        p.get_message(timeout=5)
        assert pubsub.feed is not None and len(hub.watchers) == 1
        p.punsubscribe("*")
        p.get_message(timeout=5)
        deadline = time.monotonic() + 10
        while hub.watchers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pubsub.feed is None and not hub.watchers
        p.psubscribe("*")
        p.get_message(timeout=5)
        p.close()  # the connection goes: its subscriptions, and the feed, with it
        while hub.watchers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pubsub.feed is None and not hub.watchers and not pubsub.channels
        c.close()
    finally:
        s.close()


def test_a_subscriber_that_never_reads_is_dropped_at_its_bound(tmp_path):
    limit = 256 * 1024
    s = InProcess(str(tmp_path / "s"), limits=RespLimits(max_pubsub_output_bytes=limit))
    try:
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", s.port))
        slow.sendall(command(b"PSUBSCRIBE", b"*"))
        time.sleep(0.2)
        c = s.client()
        sent = [c.publish("big", b"x" * 100_000) for _ in range(300)]  # 30 MB it does not read: past the
        # kernel's socket buffers, then past the limit in the server's
        assert sent[0] == 1 and sent[-1] == 0, "the slow subscriber was not dropped"
        assert c.info("stats")["client_output_buffer_limit_disconnections"] == 1
        for n in range(20):  # the server goes on for everyone else
            assert c.set(f"k{n}", n) and c.get(f"k{n}") == str(n).encode()
        slow.close()
        c.close()
    finally:
        s.close()
