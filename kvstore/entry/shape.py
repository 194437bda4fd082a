"""The shape a decoded batch must have: :func:`parse_ops` unpacks a payload
and checks every op against the format's rules (:mod:`kvstore.entry.codec`'s
module docstring states them, and why), raising :class:`NotABatch` with the
reason; :func:`kvstore.entry.codec.decode` and ``parse`` add where and what
to do. Kept apart from the encoding: the rules grow with every op the
format gains, while encoding a batch does not change."""

from __future__ import annotations

from typing import Final

import msgpack

from kvstore.entry.limits import DEFAULT_KEYSPACE, MAX_BOUND_BYTES, MAX_KEY_BYTES, keyspace_problem
from kvstore.entry.opcodes import (
    CONDITION_CODES,
    GROUP_CODES,
    GROUP_WRITE_CODES,
    KEYSPACE_CODES,
    MAX_APP_ID_CHARS,
    MAX_GROUP_ID_BYTES,
    MAX_LEASE_ID,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_DROP_KEYSPACE,
    OP_EXPIRE,
    OP_FAILED,
    OP_GRANT,
    OP_GROUP_COMMIT,
    OP_GROUP_PART,
    OP_KEEPALIVE,
    OP_KEYSPACE,
    OP_NAMES,
    OP_PUT,
    OP_PUT_EXPIRING,
    OP_PUT_LEASED,
    OP_REQUIRE_EQUALS,
    OP_REQUIRE_LEASE,
    OP_REVOKE,
)

_unpackb: Final = msgpack.unpackb


class NotABatch(ValueError):
    """Why a payload is not a batch (decode and parse add the context)."""


def parse_ops(payload: bytes) -> list[list]:
    try:
        ops = _unpackb(payload, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise NotABatch(f"not msgpack ({type(exc).__name__}: {exc})") from None
    if type(ops) is not list:
        raise NotABatch(f"top level is {type(ops).__name__}, not an array of ops")
    if len(ops) == 1:  # the common entry, one put: checked inline
        op = ops[0]
        if (type(op) is list and len(op) == 3 and type(op[0]) is int and op[0] == OP_PUT
                and type(op[1]) is bytes and type(op[2]) is bytes
                and 0 < len(op[1]) <= MAX_KEY_BYTES):
            return ops
    writes = False
    grouped = False
    for i, op in enumerate(ops):
        if type(op) is not list or not op:
            raise NotABatch(f"op {i} is {type(op).__name__}, not an array")
        code = op[0]
        n = len(op)
        if type(code) is int and code in GROUP_CODES:
            _check_group_head(i, op, ops)
            grouped = True
            continue
        if grouped and (type(code) is not int or code not in GROUP_WRITE_CODES):
            raise NotABatch(f"op {i} has code {code!r}, which never stands in a staged group "
                             "(a group holds puts, deletes, range deletes, TTL puts and keyspace ops)")
        if type(code) is int and code == OP_FAILED:
            _check_failed(i, op, ops)
            continue
        if type(code) is int and code in CONDITION_CODES:
            _check_condition(i, op, writes)
            continue
        if type(code) is int and code in KEYSPACE_CODES:
            writes |= _check_keyspace_op(i, op)
            continue
        writes = True
        if code == OP_PUT and n == 3 and type(code) is int:
            key, value = op[1], op[2]
            if type(key) is not bytes or type(value) is not bytes:
                raise NotABatch(f"op {i} (put) has a non-bin key or value")
            if not 0 < len(key) <= MAX_KEY_BYTES:
                raise NotABatch(f"op {i} (put) has a {len(key)}-byte key")
        elif code == OP_DELETE and n == 2 and type(code) is int:
            key = op[1]
            if type(key) is not bytes:
                raise NotABatch(f"op {i} (delete) has a non-bin key")
            if not 0 < len(key) <= MAX_KEY_BYTES:
                raise NotABatch(f"op {i} (delete) has a {len(key)}-byte key")
        elif type(code) is int and OP_PUT_EXPIRING <= code <= OP_EXPIRE:
            _check_expiry(i, op)
        elif code == OP_DELETE_RANGE and n == 3 and type(code) is int:
            start, end = op[1], op[2]
            if type(start) is not bytes or type(end) is not bytes:
                raise NotABatch(f"op {i} (delete_range) has a non-bin bound")
            if len(start) > MAX_BOUND_BYTES or len(end) > MAX_BOUND_BYTES:
                raise NotABatch(f"op {i} (delete_range) has a bound over "
                           f"{MAX_BOUND_BYTES} bytes")
        else:
            raise NotABatch(f"op {i} has code {code!r} and {n} fields")
    if writes and ops[0][0] == OP_FAILED:
        raise NotABatch("a failed batch holds its conditions and no write")
    return ops


def _check_failed(i: int, op: list, ops: list) -> None:
    if i != 0 or len(op) != 2 or type(op[1]) is not int or not 0 <= op[1] < len(ops) - 1:
        raise NotABatch(f"op {i} (failed) must stand first as [7, index of one of the conditions after it]")


def _check_group_head(i: int, op: list, ops: list) -> None:
    code = op[0]
    gid = op[1] if len(op) > 1 else None
    if i != 0 or type(gid) is not bytes or not 0 < len(gid) <= MAX_GROUP_ID_BYTES:
        raise NotABatch(f"op {i} ({OP_NAMES[code]}) must stand first, naming its group by 1..{MAX_GROUP_ID_BYTES} "
                         "bytes")
    if code == OP_GROUP_PART:
        if len(op) != 3 or not _is_u32(op[2]):
            raise NotABatch("op 0 (group_part) must be [20, group, index]")
    elif code == OP_GROUP_COMMIT:
        if (len(op) != 6 or type(op[2]) is not int or not 0 < op[2] < 1 << 63 or not _is_u32(op[3])
                or type(op[4]) is not str or len(op[4]) > MAX_APP_ID_CHARS or not _is_instant(op[5])):
            raise NotABatch("op 0 (group_commit) must be [21, group, first_part_lsn, part_count, app_id, "
                             "app_version]")
    elif len(op) != 2 or len(ops) != 1:
        raise NotABatch("a group_abort entry is [[22, group]] alone")


def _is_u32(x: object) -> bool:
    return type(x) is int and 0 <= x < 1 << 32


def _check_keyspace_op(i: int, op: list) -> bool:
    """Check ``[16, name]`` or ``[17, name]``; True for a drop (a write)."""
    code = op[0]
    if len(op) != 2:
        raise NotABatch(f"op {i} has code {code!r} and {len(op)} fields")
    why = keyspace_problem(op[1])
    if why is None and code == OP_DROP_KEYSPACE and op[1] == DEFAULT_KEYSPACE:
        why = "the default keyspace is never dropped"
    if why is not None:
        raise NotABatch(f"op {i} ({'keyspace' if code == OP_KEYSPACE else 'drop_keyspace'}): {why}")
    return code == OP_DROP_KEYSPACE


def _is_lease(x: object) -> bool:
    return type(x) is int and 0 < x <= MAX_LEASE_ID


def _is_instant(x: object) -> bool:
    return type(x) is int and 0 <= x < 1 << 63


_EXPIRY_SHAPES: Final = {  # code: (name, fields, check of the fields after the code)
    OP_PUT_EXPIRING: ("put with an expiry", 4, lambda op: _is_key(op[1]) and type(op[2]) is bytes
                      and _is_instant(op[3])),
    OP_PUT_LEASED: ("put under a lease", 4, lambda op: _is_key(op[1]) and type(op[2]) is bytes
                    and _is_lease(op[3])),
    OP_GRANT: ("grant", 4, lambda op: _is_lease(op[1]) and _is_instant(op[2]) and op[2] > 0
               and _is_instant(op[3])),
    OP_KEEPALIVE: ("keep-alive", 3, lambda op: _is_lease(op[1]) and _is_instant(op[2])),
    OP_REVOKE: ("revoke", 2, lambda op: _is_lease(op[1])),
    OP_EXPIRE: ("expire", 2, lambda op: _is_key(op[1])),
}


def _is_key(x: object) -> bool:
    return type(x) is bytes and 0 < len(x) <= MAX_KEY_BYTES


def _check_expiry(i: int, op: list) -> None:
    shape = _EXPIRY_SHAPES.get(op[0])
    if shape is None:
        raise NotABatch(f"op {i} has code {op[0]!r} and {len(op)} fields")
    name, n, ok = shape
    if len(op) != n or not ok(op):
        raise NotABatch(f"op {i} ({name}) must be {n} fields of the shape the format gives")


def _check_condition(i: int, op: list, after_write: bool) -> None:
    code, n = op[0], len(op)
    if after_write:
        raise NotABatch(f"op {i} is a condition after a write (conditions come first)")
    if code == OP_REQUIRE_LEASE:
        if n != 2 or not _is_lease(op[1]):
            raise NotABatch(f"op {i} (lease condition) must be [10, lease id]")
        return
    if n != (3 if code == OP_REQUIRE_EQUALS else 2):
        raise NotABatch(f"op {i} has code {code!r} and {n} fields")
    key = op[1]
    if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_BYTES:
        raise NotABatch(f"op {i} (condition) has a bad key")
    if n == 3 and type(op[2]) is not bytes:
        raise NotABatch(f"op {i} (condition) has a non-bin expected value")
