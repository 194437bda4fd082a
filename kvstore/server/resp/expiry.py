"""Expiry on walkv's TTLs: EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (with NX,
XX, GT, LT), PERSIST, TTL, PTTL, EXPIRETIME, PEXPIRETIME.

A walkv TTL belongs to a put (:mod:`kvstore.store.expiring`): the key's
value is written again with the new instant, which the writer decides in log
order from the value it finds there (so a concurrent write is never undone).
An instant at or before now deletes the key, as Redis does. A key under a
walkv lease (put through the embedded or HTTP API) reports its lease's
time; EXPIRE or PERSIST moves it off the lease.
"""

from __future__ import annotations

from typing import Any

from kvstore.server.resp.args import I64_MAX, as_int, text
from kvstore.server.resp.keyview import KeyView
from kvstore.server.resp.replies import RespError


def expire(v: KeyView, cmd: list[bytes]) -> Any:
    name = text(cmd[0])
    flags = set()
    for raw in cmd[3:]:
        flag = text(raw)
        if flag not in ("NX", "XX", "GT", "LT"):
            raise RespError(f"ERR Unsupported option {raw.decode('utf-8', 'replace')}")
        flags.add(flag)
    if "NX" in flags and len(flags) > 1:
        raise RespError("ERR NX and XX, GT or LT options at the same time are not compatible")
    if {"GT", "LT"} <= flags:
        raise RespError("ERR GT and LT options at the same time are not compatible")
    n = as_int(cmd[2])
    scale = 1000 if name.startswith("P") else 1_000_000
    absolute = name.endswith("AT")
    if abs(n) > I64_MAX // scale:
        raise RespError(f"ERR invalid expire time in '{name.lower()}' command")
    at = n * scale if absolute else v.now_us() + n * scale
    value = v.get(cmd[1])
    if value is None:
        return 0
    left = v.ttl_us(cmd[1])
    current = None if left is None else v.now_us() + left
    if ("NX" in flags and current is not None) or ("XX" in flags and current is None):
        return 0
    if "GT" in flags and (current is None or at <= current):
        return 0
    if "LT" in flags and current is not None and at >= current:
        return 0
    if at <= v.now_us():
        v.delete(cmd[1])
    else:
        v.put(cmd[1], value, at_us=at)
    return 1


def persist(v: KeyView, cmd: list[bytes]) -> Any:
    value = v.get(cmd[1])
    if value is None or v.ttl_us(cmd[1]) is None:
        return 0
    v.put(cmd[1], value)
    return 1


def ttl(v: KeyView, cmd: list[bytes]) -> Any:
    """TTL/PTTL: the time left, -1 without a TTL, -2 for no key."""
    if v.get(cmd[1]) is None:
        return -2
    left = v.ttl_us(cmd[1])
    if left is None:
        return -1
    ms = left // 1000
    return ms if text(cmd[0]) == "PTTL" else (ms + 500) // 1000


def expiretime(v: KeyView, cmd: list[bytes]) -> Any:
    """EXPIRETIME/PEXPIRETIME: the instant the key expires, -1 without a TTL, -2 for no key."""
    if v.get(cmd[1]) is None:
        return -2
    left = v.ttl_us(cmd[1])
    if left is None:
        return -1
    at = v.now_us() + left
    return at // 1000 if text(cmd[0]) == "PEXPIRETIME" else at // 1_000_000

