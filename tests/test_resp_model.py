"""The RESP face against the reference: the same random command sequences,
through redis-py over RESP2 and RESP3, to walkv and to a real redis-server
(the model: Redis's own semantics and error strings), every answer compared.

Generated: strings, counters, keys, expiry and MULTI/EXEC blocks over a few
keys and values chosen to hit the edge cases (integers at the 64-bit edge,
floats, words, empty strings), wrong arities, unknown commands and bad
options. Normalised only where walkv may differ by design: the time left of
a TTL (compared within 2 s), and KEYS's order (sorted). The stores: walkv with
``sync="none"`` (the semantics are the same; durability has its own tests).
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.resp_fixture import InProcess, start_redis

redis = pytest.importorskip("redis")

KEYS = [b"a", b"b", b"c:1", b"n"]
VALUES = [b"", b"0", b"1", b"-7", b"10", b"3.5", b"abc", b"9223372036854775807", b"-9223372036854775808",
          b"1e3", b"007", b" 1", b"xyz\x00\xff"]
INTS = [b"-1", b"0", b"1", b"2", b"100", b"abc", b"1.5", b"9223372036854775807", b"-9223372036854775808", b""]
TTLS = [b"100", b"1000", b"0", b"-5", b"abc", b"9223372036854775807"]
FLOATS = [b"1", b"0.5", b"-2.25", b"1e2", b"abc", b"inf", b"nan", b""]

k = st.sampled_from(KEYS)
v = st.sampled_from(VALUES)
i = st.sampled_from(INTS)
ttl = st.sampled_from(TTLS)


def _set_options() -> st.SearchStrategy[list[bytes]]:
    expiry = st.sampled_from([[], [b"EX", b"100"], [b"PX", b"100000"], [b"EX", b"0"], [b"KEEPTTL"],
                              [b"EX", b"abc"], [b"EXAT", b"4000000000"], [b"PXAT", b"4000000000000"]])
    cond = st.sampled_from([[], [b"NX"], [b"XX"], [b"NX", b"XX"]])
    get = st.sampled_from([[], [b"GET"]])
    return st.tuples(expiry, cond, get).flatmap(lambda t: st.permutations(t[0] + t[1] + t[2]))


def _cmd(name: bytes, *parts: st.SearchStrategy) -> st.SearchStrategy[list[bytes]]:
    return st.tuples(*parts).map(lambda t: [name, *t])


SINGLE = st.one_of(
    _cmd(b"GET", k), _cmd(b"SET", k, v), st.tuples(k, v, _set_options()).map(lambda t: [b"SET", t[0], t[1], *t[2]]),
    _cmd(b"SETNX", k, v), _cmd(b"SETEX", k, ttl, v), _cmd(b"PSETEX", k, ttl, v), _cmd(b"GETSET", k, v),
    _cmd(b"GETDEL", k),
    st.tuples(k, st.sampled_from([[], [b"PERSIST"], [b"EX", b"100"], [b"PX", b"5000"], [b"EX", b"-1"],
                                  [b"FOO"]])).map(lambda t: [b"GETEX", t[0], *t[1]]),
    st.lists(k, min_size=1, max_size=4).map(lambda ks: [b"MGET", *ks]),
    st.lists(st.tuples(k, v), min_size=1, max_size=3).map(lambda ps: [b"MSET", *[x for p in ps for x in p]]),
    st.lists(st.tuples(k, v), min_size=1, max_size=3).map(lambda ps: [b"MSETNX", *[x for p in ps for x in p]]),
    _cmd(b"APPEND", k, v), _cmd(b"STRLEN", k), _cmd(b"GETRANGE", k, i, i), _cmd(b"SETRANGE", k,
                                                                                  st.sampled_from([b"0", b"2", b"-1", b"abc"]), v),
    _cmd(b"INCR", k), _cmd(b"DECR", k), _cmd(b"INCRBY", k, i), _cmd(b"DECRBY", k, i),
    _cmd(b"INCRBYFLOAT", k, st.sampled_from(FLOATS)),
    st.lists(k, min_size=1, max_size=4).map(lambda ks: [b"DEL", *ks]),
    st.lists(k, min_size=1, max_size=4).map(lambda ks: [b"UNLINK", *ks]),
    st.lists(k, min_size=1, max_size=4).map(lambda ks: [b"EXISTS", *ks]),
    _cmd(b"TYPE", k), _cmd(b"RENAME", k, k), _cmd(b"RENAMENX", k, k),
    st.tuples(st.sampled_from([b"EXPIRE", b"PEXPIRE"]), k, ttl,
              st.sampled_from([[], [b"NX"], [b"XX"], [b"GT"], [b"LT"], [b"NX", b"XX"], [b"GT", b"LT"],
                               [b"FOO"]])).map(lambda t: [t[0], t[1], t[2], *t[3]]),
    _cmd(b"EXPIREAT", k, st.sampled_from([b"1", b"4000000000", b"abc"])),
    _cmd(b"PEXPIREAT", k, st.sampled_from([b"1", b"4000000000000"])),
    _cmd(b"PERSIST", k), _cmd(b"TTL", k), _cmd(b"PTTL", k), _cmd(b"EXPIRETIME", k), _cmd(b"PEXPIRETIME", k),
    st.just([b"DBSIZE"]), st.sampled_from([[b"KEYS", b"*"], [b"KEYS", b"c*"], [b"KEYS", b"[ab]"],
                                           [b"KEYS", b"?"], [b"KEYS", b"\\a"]]),
    st.sampled_from([[b"SELECT", b"0"], [b"SELECT", b"1"], [b"SELECT", b"16"], [b"SELECT", b"x"]]),
    st.sampled_from([[b"PING"], [b"PING", b"hi"], [b"ECHO", b"x"], [b"ECHO"], [b"GET"], [b"SET", b"a"],
                     [b"INCR", b"a", b"b"], [b"NOSUCH", b"a"], [b"GETRANGE", b"a", b"0"], [b"FLUSHDB", b"X"]]),
    st.just([b"FLUSHDB"]),
)
BLOCK = st.lists(SINGLE.filter(lambda c: c[0] not in (b"KEYS", b"DBSIZE", b"SELECT", b"FLUSHDB")),
                 min_size=0, max_size=5).map(lambda cs: ("multi", cs))
STEP = st.one_of(SINGLE.map(lambda c: ("one", c)), BLOCK)

EXAMPLES = int(os.environ.get("RESP_MODEL_EXAMPLES", "60"))
TIMED = {b"TTL": 1, b"PTTL": 1000, b"EXPIRETIME": 1, b"PEXPIRETIME": 1000}


def _run(client, step):
    kind, body = step
    if kind == "one":
        return _answer(lambda: client.execute_command(*body), body)
    pipe = client.pipeline(transaction=True)
    for c in body:
        pipe.execute_command(*c)
    out = _answer(lambda: pipe.execute(raise_on_error=False), [b"EXEC"])
    if isinstance(out, list):
        return [_norm(c, _err(x)) for c, x in zip(body, out)]
    return out


def _err(x):
    return ("error", str(x)) if isinstance(x, redis.exceptions.RedisError) else x


def _answer(call, cmd):
    try:
        return _norm(cmd, call())
    except redis.exceptions.ResponseError as exc:
        return ("error", str(exc))


def _norm(cmd, answer):
    name = cmd[0].upper()
    if name == b"KEYS" and isinstance(answer, list):
        return sorted(answer)
    if name in TIMED and isinstance(answer, int) and answer > 0:
        return ("about", answer if name.startswith(b"PEXPIRE") or name.startswith(b"EXPIRE") else answer,
                TIMED[name])
    return answer


def _same(ours, theirs) -> bool:
    if isinstance(ours, tuple) and isinstance(theirs, tuple) and ours[:1] == theirs[:1] == ("about",):
        return abs(ours[1] - theirs[1]) <= 2 * ours[2]
    if isinstance(ours, list) and isinstance(theirs, list):
        return len(ours) == len(theirs) and all(_same(a, b) for a, b in zip(ours, theirs))
    return ours == theirs


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    proc, port = start_redis(str(tmp_path_factory.mktemp("redis")))
    yield port
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def walkv(tmp_path_factory):
    server = InProcess(str(tmp_path_factory.mktemp("walkv") / "store"), sync="none")
    yield server
    server.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_walkv_answers_as_redis_does(walkv, reference, protocol):
    ours = walkv.client(protocol=protocol)
    theirs = redis.Redis(host="127.0.0.1", port=reference, protocol=protocol, socket_timeout=30)

    @settings(max_examples=EXAMPLES, deadline=None)
    @given(st.lists(STEP, min_size=1, max_size=25))
    def check(steps):
        for c in (ours, theirs):
            c.execute_command("SELECT", "0")
            c.execute_command("FLUSHALL")
        for n, step in enumerate(steps):
            a, b = _run(ours, step), _run(theirs, step)
            assert _same(a, b), f"step {n} {step}: walkv {a!r}, redis {b!r}"
        for db in (b"0", b"1"):
            for c in (ours, theirs):
                c.execute_command("SELECT", db)
            keys = sorted(theirs.keys())
            assert sorted(ours.keys()) == keys
            assert ours.mget(keys) == theirs.mget(keys) if keys else True

    try:
        check()
    finally:
        ours.close()
        theirs.close()
    time.sleep(0)
