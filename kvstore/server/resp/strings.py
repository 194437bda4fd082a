"""The string commands: GET, SET (EX, PX, EXAT, PXAT, NX, XX, GET, KEEPTTL),
SETNX, SETEX, PSETEX, GETSET, GETDEL, GETEX, MGET, MSET, MSETNX, APPEND,
STRLEN, GETRANGE, SETRANGE, INCR, DECR, INCRBY, DECRBY, INCRBYFLOAT.

Each is a view function (:mod:`kvstore.server.resp.keyview`): a read runs on
the event loop against the state now; a write that reads first (SET with
NX/XX/GET/KEEPTTL, INCR, APPEND ...) runs on the group's leader against the
state at its place in the log, so that it is decided in log order, as a
compare-and-set is, and never lost to a concurrent write. A write whose
answer does not depend on the state (SET, SETEX, PSETEX, MSET) is logged as
it is, straight from the loop (``run_*``): the hot path. Every write is
durable (per the store's sync mode) before its answer.

As in Redis, a write that keeps a key's value in place (APPEND, SETRANGE,
INCR...) keeps its TTL, and one that replaces it (SET, GETSET, MSET) drops it
unless told otherwise (KEEPTTL).
"""

from __future__ import annotations

import math
from typing import Any, Final

from kvstore.entry.codec import MAX_KEY_BYTES, OP_PUT, OP_PUT_EXPIRING
from kvstore.server.resp import floats
from kvstore.server.resp.args import I64_MAX, I64_MIN, SYNTAX, as_float, as_int, text
from kvstore.server.resp.keyview import KeyView, walkv_key
from kvstore.server.resp.replies import OK, RespError, Simple, bulk_or_null
from kvstore.server.resp.session import Session

OKAY: Final = Simple("OK")
MAX_OFFSET: Final = 512 * 1024 * 1024 - 1


# -- reads -------------------------------------------------------------------------


def run_get(s: Session, cmd: list[bytes]) -> None:
    """GET key: the hot read (no view function call, no encoder)."""
    if s.must_wait():
        return
    s.reply(bulk_or_null(s.view.get(cmd[1]), s.resp3))


def get(v: KeyView, cmd: list[bytes]) -> Any:
    return v.get(cmd[1])


def mget(v: KeyView, cmd: list[bytes]) -> Any:
    return [v.get(k) for k in cmd[1:]]


def strlen(v: KeyView, cmd: list[bytes]) -> Any:
    value = v.get(cmd[1])
    return 0 if value is None else len(value)


def getrange(v: KeyView, cmd: list[bytes]) -> Any:
    start, end = as_int(cmd[2]), as_int(cmd[3])
    value = v.get(cmd[1]) or b""
    n = len(value)
    if start < 0 and end < 0 and start > end:
        return b""
    start = max(0, start + n if start < 0 else start)
    end = max(0, end + n if end < 0 else end)
    end = min(end, n - 1)
    return value[start:end + 1] if start <= end and n else b""


# -- SET and its relatives ------------------------------------------------------------


class SetOptions:
    """SET's options, parsed (``at_us``: the instant the key expires)."""

    __slots__ = ("nx", "xx", "get", "keep_ttl", "at_us")

    def __init__(self, cmd: list[bytes], first: int, now_us: int) -> None:
        self.nx = self.xx = self.get = self.keep_ttl = False
        self.at_us: int | None = None
        expiry: tuple[str, bytes] | None = None
        i = first
        while i < len(cmd):
            opt = text(cmd[i])
            if opt in ("NX", "XX") and not (self.nx or self.xx):
                self.nx, self.xx = opt == "NX", opt == "XX"
            elif opt == "GET" and not self.get:
                self.get = True
            elif opt == "KEEPTTL" and expiry is None and not self.keep_ttl:
                self.keep_ttl = True
            elif opt in ("EX", "PX", "EXAT", "PXAT") and expiry is None and not self.keep_ttl and i + 1 < len(cmd):
                i += 1
                expiry = (opt, cmd[i])
            else:
                raise RespError(SYNTAX)
            i += 1
        if expiry is not None:  # checked once the options are, as Redis does
            self.at_us = expire_at(*expiry, now_us, "set")

    @property
    def reads(self) -> bool:
        """Whether the SET reads the key first (then the writer decides it)."""
        return self.nx or self.xx or self.get or self.keep_ttl


def expire_at(unit: str, raw: bytes, now_us: int, command: str) -> int:
    """The instant (µs since the epoch) an EX/PX/EXAT/PXAT argument names;
    Redis's error for one that is not positive or overflows."""
    n = as_int(raw)
    scale = 1_000_000 if unit in ("EX", "EXAT") else 1000
    if n <= 0 or n > I64_MAX // scale:
        raise RespError(f"ERR invalid expire time in '{command}' command")
    return now_us + n * scale if unit in ("EX", "PX") else n * scale


def run_set(s: Session, cmd: list[bytes]) -> None:
    """SET: a put of the connection's batch (:meth:`Session.put`) unless an
    option reads the key (then the writer decides it)."""
    at_us = None
    if len(cmd) > 3:
        opts = SetOptions(cmd, 3, s.served.now_us())
        if opts.reads:
            s.decide(set_, cmd)
            return
        at_us = opts.at_us
    s.put([put_op(s.served.max_value, cmd[1], cmd[2], at_us)], OK, at_us is None)


def put_op(max_value: int, key: bytes, value: bytes, at_us: int | None) -> list:
    """The op of a put of ``key``, expiring at ``at_us`` (None: never), checked."""
    if not 0 < len(key) <= MAX_KEY_BYTES:
        walkv_key(key)  # raises
    if len(value) > max_value:
        raise RespError(f"ERR string exceeds maximum allowed size (this store's values are at most "
                        f"{max_value} bytes)")
    return [OP_PUT, key, value] if at_us is None else [OP_PUT_EXPIRING, key, value, at_us]


def set_(v: KeyView, cmd: list[bytes]) -> Any:
    opts = SetOptions(cmd, 3, v.now_us())
    old = v.get(cmd[1])
    if (opts.nx and old is not None) or (opts.xx and old is None):
        return old if opts.get else None
    v.put(cmd[1], cmd[2], ttl_of=cmd[1] if opts.keep_ttl else None, at_us=opts.at_us)
    return old if opts.get else OKAY


def run_setex(s: Session, cmd: list[bytes]) -> None:
    """SETEX key seconds value, PSETEX key milliseconds value."""
    unit = "EX" if text(cmd[0]) == "SETEX" else "PX"
    at = expire_at(unit, cmd[2], s.served.now_us(), text(cmd[0]).lower())
    s.put([put_op(s.served.max_value, cmd[1], cmd[3], at)], OK, False)


def setex(v: KeyView, cmd: list[bytes]) -> Any:
    unit = "EX" if text(cmd[0]) == "SETEX" else "PX"
    v.put(cmd[1], cmd[3], at_us=expire_at(unit, cmd[2], v.now_us(), text(cmd[0]).lower()))
    return OKAY


def setnx(v: KeyView, cmd: list[bytes]) -> Any:
    if v.get(cmd[1]) is not None:
        return 0
    v.put(cmd[1], cmd[2])
    return 1


def getset(v: KeyView, cmd: list[bytes]) -> Any:
    old = v.get(cmd[1])
    v.put(cmd[1], cmd[2])
    return old


def getdel(v: KeyView, cmd: list[bytes]) -> Any:
    old = v.get(cmd[1])
    if old is not None:
        v.delete(cmd[1])
    return old


def run_getex(s: Session, cmd: list[bytes]) -> None:
    """GETEX: a read, or a write the writer decides when it changes the expiry."""
    if len(cmd) > 2:
        s.decide(getex, cmd)
    elif not s.must_wait():
        s.answer(getex(s.view, cmd))


def getex(v: KeyView, cmd: list[bytes]) -> Any:
    persist = False
    unit = None
    if len(cmd) > 2:
        opt = text(cmd[2])
        if opt == "PERSIST" and len(cmd) == 3:
            persist = True
        elif opt in ("EX", "PX", "EXAT", "PXAT") and len(cmd) == 4:
            unit = opt
        else:
            raise RespError(SYNTAX)
    value = v.get(cmd[1])
    if value is None:
        return None
    if unit is not None:  # validated after the look-up, as Redis does
        v.put(cmd[1], value, at_us=expire_at(unit, cmd[3], v.now_us(), "getex"))
    elif persist and v.ttl_us(cmd[1]) is not None:
        v.put(cmd[1], value)
    return value


def mset_pairs(cmd: list[bytes]) -> list[tuple[bytes, bytes]]:
    if len(cmd) % 2 != 1:
        raise RespError(f"ERR wrong number of arguments for '{text(cmd[0]).lower()}' command")
    return [(walkv_key(cmd[i]), cmd[i + 1]) for i in range(1, len(cmd), 2)]


def run_mset(s: Session, cmd: list[bytes]) -> None:
    """MSET: puts of the connection's batch, one answer."""
    limit = s.served.max_value
    s.put([put_op(limit, key, value, None) for key, value in mset_pairs(cmd)], OK, True)


def mset(v: KeyView, cmd: list[bytes]) -> Any:
    for key, value in mset_pairs(cmd):
        v.put(key, value)
    return OKAY


def msetnx(v: KeyView, cmd: list[bytes]) -> Any:
    pairs = mset_pairs(cmd)
    if any(v.get(k) is not None for k, _ in pairs):
        return 0
    for key, value in pairs:
        v.put(key, value)
    return 1


# -- in place: APPEND, SETRANGE, the counters -------------------------------------------


def append(v: KeyView, cmd: list[bytes]) -> Any:
    value = (v.get(cmd[1]) or b"") + cmd[2]
    v.put(cmd[1], value, ttl_of=cmd[1])
    return len(value)


def setrange(v: KeyView, cmd: list[bytes]) -> Any:
    offset = as_int(cmd[2])
    if offset < 0:
        raise RespError("ERR offset is out of range")
    old = v.get(cmd[1]) or b""
    patch = cmd[3]
    if not patch:
        return len(old)
    if offset + len(patch) > MAX_OFFSET:
        raise RespError("ERR string exceeds maximum allowed size (proto-max-bulk-len)")
    value = old.ljust(offset, b"\x00")[:offset] + patch + old[offset + len(patch):]
    v.put(cmd[1], value, ttl_of=cmd[1])
    return len(value)


def _counter(v: KeyView, key: bytes) -> int:
    raw = v.get(key)
    return 0 if raw is None else as_int(raw)


def _add(v: KeyView, key: bytes, delta: int) -> Any:
    n = _counter(v, key) + delta
    if not I64_MIN <= n <= I64_MAX:
        raise RespError("ERR increment or decrement would overflow")
    v.put(key, b"%d" % n, ttl_of=key)
    return n


def incr(v: KeyView, cmd: list[bytes]) -> Any:
    return _add(v, cmd[1], 1)


def decr(v: KeyView, cmd: list[bytes]) -> Any:
    return _add(v, cmd[1], -1)


def incrby(v: KeyView, cmd: list[bytes]) -> Any:
    return _add(v, cmd[1], as_int(cmd[2]))


def decrby(v: KeyView, cmd: list[bytes]) -> Any:
    delta = as_int(cmd[2])
    if delta == I64_MIN:
        raise RespError("ERR decrement would overflow")
    return _add(v, cmd[1], -delta)


def incrbyfloat(v: KeyView, cmd: list[bytes]) -> Any:
    """INCRBYFLOAT in Redis's long double arithmetic (:mod:`kvstore.server.resp.floats`)."""
    increment = as_float(cmd[2])
    raw = v.get(cmd[1])
    current = 0.0 if raw is None else as_float(raw)
    try:
        if math.isinf(increment) or math.isinf(current):
            raise floats.NotANumber(cmd[2])
        value = floats.add(raw, cmd[2])
    except floats.NotANumber:
        raise RespError("ERR increment would produce NaN or Infinity") from None
    v.put(cmd[1], value, ttl_of=cmd[1])
    return value
