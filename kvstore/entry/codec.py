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

# The argument checks are re-exported: every write path imports them from here, beside the op codes.
from kvstore.entry.limits import END_OF_KEYS as END_OF_KEYS
from kvstore.entry.limits import (
    MAX_KEY_BYTES,
    check_key,
    check_range,
    check_value,
)
from kvstore.entry.limits import as_bytes as as_bytes
from kvstore.entry.limits import check_bound as check_bound
from kvstore.entry.limits import check_keyspace as check_keyspace
from kvstore.entry.opcodes import CHANGE_NAMES as CHANGE_NAMES
from kvstore.entry.opcodes import CONDITION_CODES as CONDITION_CODES
from kvstore.entry.opcodes import DELETE as DELETE
from kvstore.entry.opcodes import DELETE_RANGE as DELETE_RANGE
from kvstore.entry.opcodes import EXPIRE as EXPIRE
from kvstore.entry.opcodes import EXPIRY_CODES as EXPIRY_CODES
from kvstore.entry.opcodes import GROUP_CODES as GROUP_CODES
from kvstore.entry.opcodes import GROUP_WRITE_CODES as GROUP_WRITE_CODES
from kvstore.entry.opcodes import KEYSPACE_CODES as KEYSPACE_CODES
from kvstore.entry.opcodes import KEYSPACE_SECTION as KEYSPACE_SECTION
from kvstore.entry.opcodes import LEASE_CODES as LEASE_CODES
from kvstore.entry.opcodes import MAX_APP_ID_CHARS as MAX_APP_ID_CHARS
from kvstore.entry.opcodes import MAX_GROUP_ID_BYTES as MAX_GROUP_ID_BYTES
from kvstore.entry.opcodes import MAX_LEASE_ID as MAX_LEASE_ID
from kvstore.entry.opcodes import NO_WRITE_CODES as NO_WRITE_CODES
from kvstore.entry.opcodes import OP_DELETE as OP_DELETE
from kvstore.entry.opcodes import OP_DELETE_RANGE as OP_DELETE_RANGE
from kvstore.entry.opcodes import OP_DROP_KEYSPACE as OP_DROP_KEYSPACE
from kvstore.entry.opcodes import OP_EXPIRE as OP_EXPIRE
from kvstore.entry.opcodes import OP_FAILED as OP_FAILED
from kvstore.entry.opcodes import OP_GRANT as OP_GRANT
from kvstore.entry.opcodes import OP_GROUP_ABORT as OP_GROUP_ABORT
from kvstore.entry.opcodes import OP_GROUP_COMMIT as OP_GROUP_COMMIT
from kvstore.entry.opcodes import OP_GROUP_PART as OP_GROUP_PART
from kvstore.entry.opcodes import OP_KEEPALIVE as OP_KEEPALIVE
from kvstore.entry.opcodes import OP_KEYSPACE as OP_KEYSPACE
from kvstore.entry.opcodes import OP_NAMES as OP_NAMES

# The op codes are the format's, named here for every reader and writer (kvstore/entry/opcodes.py).
from kvstore.entry.opcodes import OP_PUT as OP_PUT
from kvstore.entry.opcodes import OP_PUT_EXPIRING as OP_PUT_EXPIRING
from kvstore.entry.opcodes import OP_PUT_LEASED as OP_PUT_LEASED
from kvstore.entry.opcodes import OP_REQUIRE_ABSENT as OP_REQUIRE_ABSENT
from kvstore.entry.opcodes import OP_REQUIRE_EQUALS as OP_REQUIRE_EQUALS
from kvstore.entry.opcodes import OP_REQUIRE_LEASE as OP_REQUIRE_LEASE
from kvstore.entry.opcodes import OP_REQUIRE_PRESENT as OP_REQUIRE_PRESENT
from kvstore.entry.opcodes import OP_REVOKE as OP_REVOKE
from kvstore.entry.opcodes import PUT_CODES as PUT_CODES
from kvstore.entry.opcodes import UPSERT as UPSERT
from kvstore.entry.packing import pack_ops as pack_ops
from kvstore.entry.packing import put_bytes, put_head
from kvstore.entry.shape import NotABatch, parse_ops
from wal.errors import REPAIR_HINT, CorruptionError, Damage

ENTRY_OVERHEAD: Final = 64
"""Bytes a log entry adds around a batch payload, plus msgpack framing slack."""
DEFAULT_MAX_VALUE_BYTES: Final = (64 << 20) - 1024
"""Default value limit: the log's default 64 MiB record, minus room for the
key and framing. LMDB itself takes values up to 4 GiB."""

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
        return parse_ops(payload)
    except NotABatch as exc:
        raise _bad(str(exc), lsn) from None


def decode_all(payloads: list[bytes], first_lsn: int) -> list[list[list]]:
    """:func:`decode` of the payloads of consecutive entries, ``payloads[i]``
    being entry ``first_lsn + i``, in one pass: the same ops, and the same
    error, naming the first bad entry's LSN."""
    try:
        return list(map(parse_ops, payloads))
    except NotABatch:
        for lsn, payload in enumerate(payloads, first_lsn):
            decode(payload, lsn)  # raises for the first bad payload, naming its LSN
        raise


def parse(payload: bytes) -> list[list]:
    """As :func:`decode`, for a payload a caller hands in (not read from a
    log): one that is not a valid batch is a ``ValueError("not a walkv
    batch: ...")``."""
    try:
        return parse_ops(payload)
    except NotABatch as exc:
        raise ValueError(f"not a walkv batch: {exc}") from None


