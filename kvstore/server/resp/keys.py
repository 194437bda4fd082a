"""The key commands: DEL, UNLINK, EXISTS, TYPE, RENAME, RENAMENX, KEYS,
SCAN, DBSIZE, FLUSHDB, FLUSHALL.

DEL and RENAME answer from the state they change, so the writer decides them
in log order (:mod:`kvstore.server.resp.strings` says why). KEYS, SCAN and
DBSIZE read the state now, on the loop, and are not allowed in MULTI.

SCAN's cursor stands for the last key it returned
(:class:`~kvstore.server.resp.served.ScanCursors`): a scan goes on after that
key in key order, so every key present for the whole scan is returned
exactly once, however the keys change meanwhile (stronger than Redis's
guarantee, which may return a key twice). KEYS answers at most
:attr:`~kvstore.server.resp.limits.RespLimits.max_reply_bytes`.
"""

from __future__ import annotations

from typing import Any, Final

from kvstore.entry.codec import END_OF_KEYS, OP_DELETE_RANGE, OP_DROP_KEYSPACE, pack_ops
from kvstore.server.resp.args import SYNTAX, as_int, text
from kvstore.server.resp.glob import compile_glob, literal_prefix
from kvstore.server.resp.keyview import DATABASES, KeyView, keyspace_of
from kvstore.server.resp.replies import OK, RespError, Simple
from kvstore.server.resp.session import Session

OKAY: Final = Simple("OK")
SCAN_DEFAULT_COUNT: Final = 10
SCAN_MAX_COUNT: Final = 100_000


def delete(v: KeyView, cmd: list[bytes]) -> Any:
    """DEL/UNLINK key...: how many of the keys were there."""
    gone = 0
    for key in dict.fromkeys(cmd[1:]):
        if v.get(key) is not None:
            v.delete(key)
            gone += 1
    return gone


def exists(v: KeyView, cmd: list[bytes]) -> Any:
    return sum(v.get(key) is not None for key in cmd[1:])


def type_(v: KeyView, cmd: list[bytes]) -> Any:
    return Simple("none" if v.get(cmd[1]) is None else "string")


def rename(v: KeyView, cmd: list[bytes]) -> Any:
    """RENAME/RENAMENX src dst: the value and its TTL move."""
    src, dst = cmd[1], cmd[2]
    value = v.get(src)
    if value is None:
        raise RespError("ERR no such key")
    nx = text(cmd[0]) == "RENAMENX"
    if src == dst:
        return 0 if nx else OKAY
    if nx and v.get(dst) is not None:
        return 0
    v.put(dst, value, ttl_of=src)
    v.delete(src)
    return 1 if nx else OKAY


def flushdb(v: KeyView, cmd: list[bytes]) -> Any:
    _flush_mode(cmd)
    v.flush()
    return OKAY


def flushall(v: KeyView, cmd: list[bytes]) -> Any:
    _flush_mode(cmd)
    db = v.db
    for n in range(DATABASES):
        v.select(n)
        v.flush()
    v.select(db)
    return OKAY


def _flush_mode(cmd: list[bytes]) -> None:
    if len(cmd) > 2 or (len(cmd) == 2 and text(cmd[1]) not in ("ASYNC", "SYNC")):
        raise RespError(SYNTAX)


def flush_ops(dbs: range) -> list[list]:
    """The ops that empty databases ``dbs`` (the default keyspace by a range
    delete, a named one by a drop: one op each)."""
    ops: list[list] = []
    for db in dbs:
        ks = keyspace_of(db)
        ops.append([OP_DROP_KEYSPACE, ks] if ks else [OP_DELETE_RANGE, b"", END_OF_KEYS])
    return ops


def run_flushdb(s: Session, cmd: list[bytes]) -> None:
    """FLUSHDB/FLUSHALL: one entry, logged straight from the loop."""
    _flush_mode(cmd)
    ops = flush_ops(range(DATABASES) if text(cmd[0]) == "FLUSHALL" else range(s.db, s.db + 1))
    s.later(s.submit(pack_ops(ops), ops), OK)


def dbsize(s: Session, cmd: list[bytes]) -> None:
    if not s.must_wait():
        s.answer(len(s.view.reads))


def keys(s: Session, cmd: list[bytes]) -> None:
    if s.must_wait():
        return
    pattern = cmd[1]
    match = compile_glob(pattern)
    budget = s.served.limits.max_reply_bytes
    found = []
    for key, _ in s.view.reads.scan(prefix=literal_prefix(pattern) or None):
        if match(key):
            budget -= len(key) + 16
            if budget < 0:
                raise RespError(f"ERR KEYS would answer more than {s.served.limits.max_reply_bytes} bytes; "
                                f"use SCAN")
            found.append(key)
    s.answer(found)


def scan(s: Session, cmd: list[bytes]) -> None:
    """SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]."""
    cursor = as_int(cmd[1], "ERR invalid cursor")
    match = None
    count = SCAN_DEFAULT_COUNT
    kind = None
    i = 2
    while i < len(cmd):
        opt = text(cmd[i])
        if i + 1 >= len(cmd):
            raise RespError(SYNTAX)
        if opt == "MATCH":
            match = cmd[i + 1]
        elif opt == "COUNT":
            count = as_int(cmd[i + 1])
            if count < 1:
                raise RespError(SYNTAX)
        elif opt == "TYPE":
            kind = cmd[i + 1].lower()
        else:
            raise RespError(SYNTAX)
        i += 2
    if s.must_wait():
        return
    after = s.served.cursors.resume(cursor, s.db)
    test = compile_glob(match) if match is not None else None
    prefix = literal_prefix(match) if match is not None else b""
    start = prefix if after is None else max(after + b"\x00", prefix)
    found: list[bytes] = []
    last = None
    seen = 0
    for key, _ in s.view.reads.scan(start=start or None, prefix=prefix or None):
        last = key
        seen += 1
        if (test is None or test(key)) and kind in (None, b"string"):
            found.append(key)
        if seen >= min(count, SCAN_MAX_COUNT):
            break
    else:
        last = None  # the end
    s.answer([b"%d" % (0 if last is None else s.served.cursors.issue(s.db, last)), found])
