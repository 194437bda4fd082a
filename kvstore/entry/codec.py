"""The log entry payload of a key-value store: one atomic batch of operations.

Format (one log entry's payload; the log adds LSN and timestamp around it)::

    payload := msgpack array of op           (packed with use_bin_type=True)
    op      := [1, key, value]                put
             | [2, key]                       delete
             | [3, start, end]                delete_range: start <= key < end
             | [4, key, expected]             condition: key's value equals expected
             | [5, key]                       condition: key is absent
             | [6, key]                       condition: key is present
             | [7, index]                     failed: condition ``index`` did not hold
             | [8, key, value, at]            put; the key expires at instant ``at``
             | [9, key, value, lease]         put; the key lives as long as lease ``lease``
             | [10, lease]                    condition: lease ``lease`` is alive
             | [11, lease, ttl, at]           grant lease ``lease`` of ``ttl`` us, expiring at ``at``
             | [12, lease, at]                keep lease ``lease`` alive until ``at``
             | [13, lease]                    revoke lease ``lease`` (its keys are listed after it)
             | [14, key]                      expire: delete ``key``, its TTL or lease ran out
             | [16, name]                     the ops after it, up to the next [16],
                                              are in keyspace ``name`` ("": the default)
             | [17, name]                     drop keyspace ``name``: every key of it goes
             | [20, group, index]             first op of a part of staged group ``group``
             | [21, group, first_part_lsn, part_count, app_id, app_version]
                                              first op of the commit of staged group ``group``
             | [22, group]                    abort staged group ``group`` (the only op)
    group     := msgpack bin, 1..64 bytes     (the writer's, unique: a uuid4 is 16 bytes)
    index, part_count := msgpack int, 0 .. 2**32 - 1
    first_part_lsn := msgpack int, 1 .. 2**63 - 1
    app_id    := msgpack str, 0..255 characters ("": no idempotency key)
    app_version := msgpack int, 0 .. 2**63 - 1
    at, ttl   := msgpack int, microseconds (``at``: since the epoch, UTC)
    lease     := msgpack int, 1 .. 2**63 - 1
    key, value, start, end := msgpack bin     (never str; their limits, and the
                                               reasons: :mod:`kvstore.entry.limits`)

Rules, and the reason for each:

* One entry is one batch, so a batch is atomic: it has one LSN and is applied
  in one LMDB write transaction, or not at all.
* Ops apply in order, so ``[[1, k, a], [2, k]]`` leaves ``k`` absent.
* Keys, range bounds and values are held to :mod:`kvstore.entry.limits`
  (keys 1..511 bytes, bounds 0..512), when written and again when decoded.
* Conditions (codes 4..6, :mod:`kvstore.store.txn`) come before every write of
  their batch. They are decided in log order, when the batch's group is
  written, against the state every earlier entry leaves (:mod:`kvstore.entry.conditions`),
  and the decision is written into the log with the batch: a batch whose
  conditions hold is logged as made (its conditions are no-ops to every
  reader, its writes apply); a batch whose condition ``i`` fails is logged
  as ``[[7, i], conditions...]``: no writes, its LSN consumed. So the log
  alone says what happened: replay, rebuilds, watchers, replicas, the
  archive and Spark read outcomes from the bytes and never decide again.
  ``[7, i]`` only ever stands first, followed by conditions only; a
  condition after a write is not a batch (the order would be ambiguous).
* Keyspaces (:mod:`kvstore.store.keyspace`): a batch starts in the default
  keyspace (``""``); ``[16, name]`` switches the keyspace of the ops after it,
  writes and conditions alike, so one entry (one LSN) may span keyspaces
  atomically, and every entry written before keyspaces existed reads exactly
  as it did. ``[16]`` is not a write: it may stand anywhere, also among the
  leading conditions and in a failed batch. ``[17, name]`` (a write) empties
  keyspace ``name`` in one entry, whatever it holds: one op, not one per key.
  ``name`` is a msgpack str, a name :mod:`kvstore.entry.limits` allows, or
  ``""`` for the default keyspace in ``[16]`` (a default keyspace is never
  dropped). Codes 8..15 are TTL's and leases', their keys
  in the batch's current keyspace; 18 and 19 are kept for keyspaces.
* Expiry (codes 8..14, :mod:`kvstore.entry.leases`). Every instant is
  absolute, decided by the writer from its clock and logged (``at`` =
  the writer's now + the TTL), so replay, rebuilds, replicas, the archive
  and Spark read when a key expires from the bytes and never consult a
  clock to change state. A key has at most one of a TTL (8) and a lease
  (9); any later write of it (1, 2, 3, 8, 9, 14) replaces or drops what it
  had, as a plain ``SET`` drops a Redis TTL. Expiry itself is a logged
  deletion (14), written by the store's sweeper, because a reader of the
  log (a watcher, Spark) must see when a key went without state or a
  clock; reads meanwhile compare instants against their own clock, so an
  expired key is absent to them before it is swept. Which keys a sweep or
  a revoke deletes is decided by the writer in log order, as conditions
  are, and written into the entry: ``[[13, lease], [2, key]...]`` for a
  revoke (deletes: the user asked), ``[[13, lease], [14, key]...]`` for a
  lease that ran out, ``[[14, key]...]`` for keys whose TTL ran out. A
  lease with more keys than one entry should hold is ended over several
  entries: its keys in bounded runs of 14s (a revoke first keeps it alive
  until now, ``[12, lease, now]``, so that its keys vanish at once), the
  last entry with the 13. A put under a lease, or a keep-alive, whose
  lease is not alive at its place in the log fails as a condition does:
  the writer logs it as ``[[7, i], conditions..., [10, lease]]``; 10 is
  never written otherwise. A sweep that finds nothing left to do (the
  keys were written again meanwhile) is logged as an empty batch, ``[]``.
  Codes 10..13 change no key: readers of changes skip them.
* Expiry and keyspaces: a key's TTL or lease belongs to the key in its
  keyspace (``[16, "users"], [8, k, v, at]`` expires ``k`` of ``users``), so
  the 14s of a sweep and the keys a revoke lists carry ``[16, name]``
  switches between keyspaces, in the one entry. Leases themselves (10..13)
  are store-wide, whatever the current keyspace: one lease may hold keys of
  several keyspaces, and its revoke deletes them all. ``[17, name]`` drops
  the TTLs of the keyspace's keys and detaches them from their leases.
* Staged groups (codes 20..22, :mod:`kvstore.entry.groups`): one atomic
  write larger than one log record (the log bounds a record,
  ``max_record_bytes``), spread over several entries of bounded size. A
  *part* ``[[20, group, index], ops...]`` changes nothing when it is
  applied: its ops wait in the state machine's bookkeeping
  (:mod:`kvstore.state.groups`). The *commit* ``[[21, group,
  first_part_lsn, part_count, app_id, app_version], ops...]`` applies the
  whole group at once, at its own LSN: every part's ops in part order, then
  its own, as ONE batch (one LMDB write transaction), so a group is atomic
  as a batch is. ``[[22, group]]`` aborts a group: its parts are dropped.
  Rules, and why:

  - A group's parts and its commit (or abort) have CONSECUTIVE LSNs:
    parts ``first_part_lsn .. first_part_lsn + part_count - 1`` with
    indexes ``0 .. part_count - 1``, and the commit right after them
    (``first_part_lsn + part_count`` is the commit's LSN). Its writer
    appends them with nothing between (:mod:`kvstore.store.groups`), so a
    reader of the log that meets a commit reads the group back from the
    LSNs just before it, with the entry readers it has, and needs no
    memory of the log before it (a watcher or a Spark partition that
    starts between a group's parts and its commit sees the group whole at
    the commit). An abort is written by a writer that failed part way, and
    for parts whose writer died (by the next open of the store,
    :mod:`kvstore.store.groups`); it need not follow the parts at once,
    since readers skip both. Log retention keeps the log from the first
    part of a group that spans its cut.
  - Readers of changes (watch, replicas' watchers, Spark, export) show
    nothing of a part or an abort, and every op of the group at its
    commit, numbered through the group (part 0's ops first, the commit's
    own last), as one batch's.
  - Every part, and the commit's own ops, start in the default keyspace
    (as every batch does), so a part reads alone.
  - The ops of a part or a commit are writes that need no decision:
    put (1), delete (2), delete_range (3), put with a TTL (8), keyspace
    switches (16) and drops (17). Conditions and leases are decided in log
    order at their own LSN, which a group's ops do not have until their
    commit: they never stand in a group.
  - Idempotency: a commit with an ``app_id`` records ``app_version`` as
    that application's last committed version (Delta's
    ``txnAppId``/``txnVersion``). Whether a commit applies is decided by
    its writer in log order, as conditions are (:mod:`kvstore.store.groups`):
    a group whose version is not above the recorded one is logged as an
    abort, never as a commit, so the log alone says what happened and a
    commit always applies.

* Decoding is strict: a payload that is valid msgpack but not a batch of this
  shape is corruption (:class:`~wal.errors.CorruptionError` naming the LSN),
  never silently skipped, because skipping it would lose an acknowledged write.

The Spark data source reads log segments directly and decodes them with
:func:`decode`.
"""

from __future__ import annotations

from typing import Final, Iterable

import msgpack
from mypy_extensions import mypyc_attr

from kvstore.entry.limits import (
    DEFAULT_KEYSPACE,
    MAX_BOUND_BYTES,
    MAX_KEY_BYTES,
    check_key,
    check_range,
    check_value,
    keyspace_problem,
)

# The argument checks are re-exported: every write path imports them from here, beside the op codes.
from kvstore.entry.limits import END_OF_KEYS as END_OF_KEYS
from kvstore.entry.limits import as_bytes as as_bytes
from kvstore.entry.limits import check_bound as check_bound
from kvstore.entry.limits import check_keyspace as check_keyspace
from kvstore.entry.packing import pack_ops as pack_ops
from kvstore.entry.packing import put_bytes, put_head
from wal.errors import REPAIR_HINT, CorruptionError, Damage

OP_PUT: Final = 1
OP_DELETE: Final = 2
OP_DELETE_RANGE: Final = 3
OP_REQUIRE_EQUALS: Final = 4
OP_REQUIRE_ABSENT: Final = 5
OP_REQUIRE_PRESENT: Final = 6
OP_FAILED: Final = 7
OP_PUT_EXPIRING: Final = 8
OP_PUT_LEASED: Final = 9
OP_REQUIRE_LEASE: Final = 10
OP_GRANT: Final = 11
OP_KEEPALIVE: Final = 12
OP_REVOKE: Final = 13
OP_EXPIRE: Final = 14
OP_KEYSPACE: Final = 16
OP_DROP_KEYSPACE: Final = 17
OP_GROUP_PART: Final = 20
OP_GROUP_COMMIT: Final = 21
OP_GROUP_ABORT: Final = 22
OP_NAMES: Final = {OP_PUT: "put", OP_DELETE: "delete", OP_DELETE_RANGE: "delete_range",
                   OP_REQUIRE_EQUALS: "require_equals", OP_REQUIRE_ABSENT: "require_absent",
                   OP_REQUIRE_PRESENT: "require_present", OP_FAILED: "failed", OP_PUT_EXPIRING: "put_expiring",
                   OP_PUT_LEASED: "put_leased", OP_REQUIRE_LEASE: "require_lease", OP_GRANT: "grant",
                   OP_KEEPALIVE: "keepalive", OP_REVOKE: "revoke", OP_EXPIRE: "expire", OP_KEYSPACE: "keyspace",
                   OP_DROP_KEYSPACE: "drop_keyspace", OP_GROUP_PART: "group_part",
                   OP_GROUP_COMMIT: "group_commit", OP_GROUP_ABORT: "group_abort"}
"""Every op code of the format (the module docstring's) and its name: the one
full list, which whatever shows every op (``walkv inspect``) is held to."""
CONDITION_CODES: Final = frozenset((OP_REQUIRE_EQUALS, OP_REQUIRE_ABSENT, OP_REQUIRE_PRESENT, OP_REQUIRE_LEASE))
NO_WRITE_CODES: Final = CONDITION_CODES | {OP_FAILED}
"""Op codes that change nothing (a reader skips them; a batch starting with
``OP_FAILED`` applies nothing)."""
PUT_CODES: Final = frozenset((OP_PUT, OP_PUT_EXPIRING, OP_PUT_LEASED))
"""Op codes that set a key to a value (``[code, key, value, ...]``)."""
LEASE_CODES: Final = frozenset((OP_GRANT, OP_KEEPALIVE, OP_REVOKE))
"""Op codes that change a lease and no key (readers of changes skip them)."""
EXPIRY_CODES: Final = frozenset((OP_PUT_EXPIRING, OP_PUT_LEASED, OP_EXPIRE)) | LEASE_CODES
"""Op codes that read or write expiry metadata (:mod:`kvstore.state.expiry`)."""
MAX_LEASE_ID: Final = (1 << 63) - 1
KEYSPACE_CODES: Final = frozenset((OP_KEYSPACE, OP_DROP_KEYSPACE))
"""Op codes of keyspaces: a batch holding one is applied op by op, keyspace by keyspace."""

GROUP_CODES: Final = frozenset((OP_GROUP_PART, OP_GROUP_COMMIT, OP_GROUP_ABORT))
"""Op codes that head an entry of a staged group (a part, a commit, an abort)."""
GROUP_WRITE_CODES: Final = frozenset((OP_PUT, OP_DELETE, OP_DELETE_RANGE, OP_PUT_EXPIRING, OP_KEYSPACE,
                                      OP_DROP_KEYSPACE))
"""Op codes that may stand in a staged group (after its head op)."""
MAX_GROUP_ID_BYTES: Final = 64
MAX_APP_ID_CHARS: Final = 255

KEYSPACE_SECTION: Final = "ks:"
"""Keyspace ``name`` is the snapshot section ``ks:<name>`` (the default keyspace is the default section)."""

# What a change is called, wherever changes are shown (the Spark ``changes``
# table's ``_change_type``, :meth:`kvstore.KVStore.watch`): named once, here.
UPSERT: Final = "upsert"
DELETE: Final = "delete"
DELETE_RANGE: Final = "delete_range"
EXPIRE: Final = "expire"
CHANGE_NAMES: Final = {OP_PUT: UPSERT, OP_PUT_EXPIRING: UPSERT, OP_PUT_LEASED: UPSERT, OP_DELETE: DELETE,
                OP_EXPIRE: EXPIRE, OP_DELETE_RANGE: DELETE_RANGE}
"""The change each op code that changes keys is shown as (codes not here change none)."""

ENTRY_OVERHEAD: Final = 64
"""Bytes a log entry adds around a batch payload, plus msgpack framing slack."""
DEFAULT_MAX_VALUE_BYTES: Final = (64 << 20) - 1024
"""Default value limit: the log's default 64 MiB record, minus room for the
key and framing. LMDB itself takes values up to 4 GiB."""

_unpackb: Final = msgpack.unpackb


LARGE_VALUE_BYTES: Final = 1 << 20
"""A put of a value this large is logged as pieces (:func:`put_payload`)."""


def put_payload(key: bytes, value: bytes) -> tuple[bytes, bytes]:
    """The payload of ``[[PUT, key, value]]`` as two pieces, ``(head,
    value)``, whose concatenation is exactly what :func:`encode` returns: the
    log writes them without copying the value into one buffer (a 64 MiB put
    then costs about its own size in memory, not several times it)."""
    return put_head(key, len(value)), value


def put_entry(key: object, value: object, max_value: int) -> tuple[bytes | tuple[bytes, bytes], list[list]]:
    """``(payload, ops)`` of one put, its arguments checked: what every put
    path logs (a value of :data:`LARGE_VALUE_BYTES` or more as pieces,
    :func:`put_payload`). The checks cost two type tests when they pass.
    The payload is msgpack's encoding of ``ops``, written out by
    :func:`kvstore.entry.packing.put_bytes`."""
    if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_BYTES:
        key = check_key(key)
    if type(value) is not bytes or len(value) > max_value:
        value = check_value(value, max_value)
    ops = [[OP_PUT, key, value]]
    if len(value) >= LARGE_VALUE_BYTES:
        return put_payload(key, value), ops
    return put_bytes(key, value), ops


def delete_entry(key: object) -> tuple[bytes, list[list]]:
    """``(payload, ops)`` of one delete, its key checked."""
    if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_BYTES:
        key = check_key(key)
    ops = [[OP_DELETE, key]]
    return pack_ops(ops), ops


def delete_range_entry(start: object, end: object) -> tuple[bytes, list[list]]:
    """``(payload, ops)`` of one range delete, its bounds checked
    (:func:`check_range`)."""
    ops = [[OP_DELETE_RANGE, *check_range(start, end)]]
    return pack_ops(ops), ops


def in_keyspace(keyspace: str, payload: bytes | tuple[bytes, ...], ops: list[list]
                ) -> tuple[bytes | tuple[bytes, ...], list[list]]:
    """``(payload, ops)`` of a one-op write (:func:`put_entry` and the
    others) moved into the named ``keyspace`` (``""``: as it is)."""
    if not keyspace:
        return payload, ops
    ops = [[OP_KEYSPACE, keyspace], *ops]
    return pack_ops(ops), ops


def encode(ops: Iterable[list | tuple]) -> bytes:
    """The payload of a batch of already validated ops (lists or tuples of
    the shapes in the module docstring)."""
    return pack_ops(list(ops))


@mypyc_attr(native_class=False)  # mypyc compiles no subclass of list: this one stays a Python class
class PlainPuts(list):  # a list of ops, as every context is
    """A batch's operations that its builder knows to be puts only,
    ``(OP_PUT, key, value)`` with checked keys and values, in the default
    keyspace: the context a :class:`~kvstore.store.write_batch.WriteBatch`
    of puts hands the log with its payload, so that nothing on the way
    (:func:`kvstore.entry.leases.decide_group`,
    :meth:`kvstore.state.machine.State.apply`) looks at each of its ops
    again to learn that (100,000 of them: 1.3 ms). The payload is the same
    as any list of those ops would have."""

    __slots__ = ()


def batch_bytes(op_count: int, ops_bytes: int) -> int:
    """The exact length of :func:`encode` of ``op_count`` ops whose own
    encodings (:func:`op_bytes` each) add up to ``ops_bytes``. A batch is a
    msgpack array, its header then its ops, each packed as it is alone, so a
    batch can be sized from its parts before it is joined (the Spark writer
    sums its tasks')."""
    return len(msgpack.Packer().pack_array_header(op_count)) + ops_bytes


def ops_bytes(payload: bytes, op_count: int) -> int:
    """The bytes of the ops in ``payload``, the :func:`encode` of
    ``op_count`` ops (its length less the array's header): what
    :func:`batch_bytes` adds up."""
    return len(payload) - batch_bytes(op_count, 0)


def op_count(payload: bytes) -> int:
    """How many ops the batch ``payload`` holds, read from its array header
    alone (ValueError when it does not start with one)."""
    first = payload[0] if payload else 0
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    if first == 0xDC and len(payload) >= 3:
        return int.from_bytes(payload[1:3], "big")
    if first == 0xDD and len(payload) >= 5:
        return int.from_bytes(payload[1:5], "big")
    raise ValueError("not a walkv batch: it does not start with a msgpack array")


def with_head(op: list, payload: bytes) -> bytes:
    """The payload of ``[op, *ops]`` where ``payload`` is the batch of
    ``ops``, its ops' bytes copied as they are (never unpacked): how a
    staged group's part is made of an encoded batch."""
    n = op_count(payload)
    return b"".join((msgpack.Packer().pack_array_header(n + 1), pack_ops(op), payload[batch_bytes(n, 0):]))


def op_bytes(op: list | tuple) -> int:
    """The bytes one op takes in a batch (its own msgpack encoding)."""
    return len(pack_ops(op))


def _bad(reason: str, lsn: int | None) -> CorruptionError:
    return CorruptionError(f"log entry is not a valid walkv batch: {reason}",
                           kind=Damage.CONTENT, lsn=lsn, hint=REPAIR_HINT)


def decode(payload: bytes, lsn: int | None = None) -> list[list]:
    """Decode and strictly validate one batch payload.

    Returns the list of ops, each a list of one of the module docstring's
    shapes (keys and values ``bytes``). Raises
    :class:`~wal.errors.CorruptionError` naming ``lsn`` when the payload is
    not exactly that.
    """
    try:
        return _parse(payload)
    except _NotABatch as exc:
        raise _bad(str(exc), lsn) from None


def decode_all(payloads: list[bytes], first_lsn: int) -> list[list[list]]:
    """:func:`decode` of the payloads of consecutive entries, ``payloads[i]``
    being entry ``first_lsn + i``, in one pass: the same ops, and the same
    error, naming the first bad entry's LSN."""
    try:
        return list(map(_parse, payloads))
    except _NotABatch:
        for lsn, payload in enumerate(payloads, first_lsn):
            decode(payload, lsn)  # raises for the first bad payload, naming its LSN
        raise


def parse(payload: bytes) -> list[list]:
    """As :func:`decode`, for a payload a caller hands in (not read from a
    log): one that is not a valid batch is a ``ValueError("not a walkv
    batch: ...")``."""
    try:
        return _parse(payload)
    except _NotABatch as exc:
        raise ValueError(f"not a walkv batch: {exc}") from None


class _NotABatch(ValueError):
    """Why a payload is not a batch (decode and parse add the context)."""


def _parse(payload: bytes) -> list[list]:
    try:
        ops = _unpackb(payload, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise _NotABatch(f"not msgpack ({type(exc).__name__}: {exc})") from None
    if type(ops) is not list:
        raise _NotABatch(f"top level is {type(ops).__name__}, not an array of ops")
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
            raise _NotABatch(f"op {i} is {type(op).__name__}, not an array")
        code = op[0]
        n = len(op)
        if type(code) is int and code in GROUP_CODES:
            _check_group_head(i, op, ops)
            grouped = True
            continue
        if grouped and (type(code) is not int or code not in GROUP_WRITE_CODES):
            raise _NotABatch(f"op {i} has code {code!r}, which never stands in a staged group "
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
                raise _NotABatch(f"op {i} (put) has a non-bin key or value")
            if not 0 < len(key) <= MAX_KEY_BYTES:
                raise _NotABatch(f"op {i} (put) has a {len(key)}-byte key")
        elif code == OP_DELETE and n == 2 and type(code) is int:
            key = op[1]
            if type(key) is not bytes:
                raise _NotABatch(f"op {i} (delete) has a non-bin key")
            if not 0 < len(key) <= MAX_KEY_BYTES:
                raise _NotABatch(f"op {i} (delete) has a {len(key)}-byte key")
        elif type(code) is int and OP_PUT_EXPIRING <= code <= OP_EXPIRE:
            _check_expiry(i, op)
        elif code == OP_DELETE_RANGE and n == 3 and type(code) is int:
            start, end = op[1], op[2]
            if type(start) is not bytes or type(end) is not bytes:
                raise _NotABatch(f"op {i} (delete_range) has a non-bin bound")
            if len(start) > MAX_BOUND_BYTES or len(end) > MAX_BOUND_BYTES:
                raise _NotABatch(f"op {i} (delete_range) has a bound over "
                           f"{MAX_BOUND_BYTES} bytes")
        else:
            raise _NotABatch(f"op {i} has code {code!r} and {n} fields")
    if writes and ops[0][0] == OP_FAILED:
        raise _NotABatch("a failed batch holds its conditions and no write")
    return ops


def _check_failed(i: int, op: list, ops: list) -> None:
    if i != 0 or len(op) != 2 or type(op[1]) is not int or not 0 <= op[1] < len(ops) - 1:
        raise _NotABatch(f"op {i} (failed) must stand first as [7, index of one of the conditions after it]")


def _check_group_head(i: int, op: list, ops: list) -> None:
    code = op[0]
    gid = op[1] if len(op) > 1 else None
    if i != 0 or type(gid) is not bytes or not 0 < len(gid) <= MAX_GROUP_ID_BYTES:
        raise _NotABatch(f"op {i} ({OP_NAMES[code]}) must stand first, naming its group by 1..{MAX_GROUP_ID_BYTES} "
                         "bytes")
    if code == OP_GROUP_PART:
        if len(op) != 3 or not _is_u32(op[2]):
            raise _NotABatch("op 0 (group_part) must be [20, group, index]")
    elif code == OP_GROUP_COMMIT:
        if (len(op) != 6 or type(op[2]) is not int or not 0 < op[2] < 1 << 63 or not _is_u32(op[3])
                or type(op[4]) is not str or len(op[4]) > MAX_APP_ID_CHARS or not _is_instant(op[5])):
            raise _NotABatch("op 0 (group_commit) must be [21, group, first_part_lsn, part_count, app_id, "
                             "app_version]")
    elif len(op) != 2 or len(ops) != 1:
        raise _NotABatch("a group_abort entry is [[22, group]] alone")


def _is_u32(x: object) -> bool:
    return type(x) is int and 0 <= x < 1 << 32


def _check_keyspace_op(i: int, op: list) -> bool:
    """Check ``[16, name]`` or ``[17, name]``; True for a drop (a write)."""
    code = op[0]
    if len(op) != 2:
        raise _NotABatch(f"op {i} has code {code!r} and {len(op)} fields")
    why = keyspace_problem(op[1])
    if why is None and code == OP_DROP_KEYSPACE and op[1] == DEFAULT_KEYSPACE:
        why = "the default keyspace is never dropped"
    if why is not None:
        raise _NotABatch(f"op {i} ({'keyspace' if code == OP_KEYSPACE else 'drop_keyspace'}): {why}")
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
        raise _NotABatch(f"op {i} has code {op[0]!r} and {len(op)} fields")
    name, n, ok = shape
    if len(op) != n or not ok(op):
        raise _NotABatch(f"op {i} ({name}) must be {n} fields of the shape the format gives")


def _check_condition(i: int, op: list, after_write: bool) -> None:
    code, n = op[0], len(op)
    if after_write:
        raise _NotABatch(f"op {i} is a condition after a write (conditions come first)")
    if code == OP_REQUIRE_LEASE:
        if n != 2 or not _is_lease(op[1]):
            raise _NotABatch(f"op {i} (lease condition) must be [10, lease id]")
        return
    if n != (3 if code == OP_REQUIRE_EQUALS else 2):
        raise _NotABatch(f"op {i} has code {code!r} and {n} fields")
    key = op[1]
    if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_BYTES:
        raise _NotABatch(f"op {i} (condition) has a bad key")
    if n == 3 and type(op[2]) is not bytes:
        raise _NotABatch(f"op {i} (condition) has a non-bin expected value")
