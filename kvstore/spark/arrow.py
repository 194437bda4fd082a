"""The Spark tables' columns and their conversion to Arrow (no pyspark here).

Three tables, one schema each; ``K`` and ``V`` are ``binary`` by default, or
``string`` (UTF-8, validated) with the options ``keyFormat`` / ``valueFormat``:

``snapshot``   key K not null, value V not null, lsn bigint not null
               (the snapshot's LSN, the same on every row)

``changes``    key K not null, value V, end_key K, _change_type string not null,
               _commit_version bigint not null, _commit_timestamp timestamp not
               null, _op_index int not null: one row per operation of every
               log entry (an entry is one atomic batch), named after Delta
               Lake's change data feed. ``_commit_version`` is the entry's LSN,
               ``_commit_timestamp`` its commit time (UTC, microseconds) and
               ``_op_index`` the operation's position in its batch (0-based;
               operations apply in that order). ``_change_type`` is:

               * ``upsert``: put(key, value). The log does not say whether the
                 key existed, so Delta's insert/update_postimage are one type
                 here; ``changeVocabulary=delta`` gives Delta's types, with
                 pre-images (:mod:`kvstore.spark.delta_cdf`);
               * ``delete``: delete(key); value is null;
               * ``delete_range``: every key in [key, end_key) is deleted; value
                 is null. end_key is null for the other types.

               A conditional write's conditions are not changes; one whose
               conditions failed has no rows (the log records the decision,
               :mod:`kvstore.entry.conditions`). A staged group (a write
               larger than one log entry, :mod:`kvstore.entry.groups`) has
               no rows at its parts and every row of the group at its
               commit's LSN, ``_op_index`` numbered through the group.

               A batch read covers the LSNs after the snapshot it is planned
               with, up to the durable LSN (:mod:`kvstore.spark.options`);
               ``startingLsn=earliest`` reads the whole log.

``state``      key K not null, value V not null, lsn bigint not null (the LSN
               that last wrote the key; the snapshot's LSN for untouched keys)

Every table ends with ``keyspace`` string not null: the keyspace of the row
("" the default one, :mod:`kvstore.store.keyspace`). A read covers the
keyspace the option ``keyspace`` names (default ""), or with ``*`` every
keyspace (every table and format); a drop of a keyspace is a
``delete_range`` of all its keys (``key`` b"", ``end_key`` 512 bytes of
0xff) in ``changes``.

Arrow types match what Spark expects for these schemas exactly
(``binary``/``string``, ``int64``, ``int32``, ``timestamp[us, tz=UTC]``, with
the same nullability), because Spark rejects record batches that differ.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import pyarrow as pa

from kvstore.entry.codec import (
    CONDITION_CODES,
    DELETE,
    DELETE_RANGE,
    END_OF_KEYS,
    EXPIRE,
    LEASE_CODES,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_DROP_KEYSPACE,
    OP_EXPIRE,
    OP_FAILED,
    OP_KEYSPACE,
    OP_PUT,
    PUT_CODES,
    UPSERT,
)
from kvstore.entry.groups import ReadBack, entry_runs, group_code
from wal.errors import CorruptionError, Damage

BINARY = "binary"
STRING = "string"
FORMATS = (BINARY, STRING)

SNAPSHOT = "snapshot"
CHANGES = "changes"
STATE = "state"
TABLES = (SNAPSHOT, CHANGES, STATE)

CHANGE_TYPES = (UPSERT, DELETE, DELETE_RANGE, EXPIRE)


# (name, kind, nullable); kind "K"/"V" become binary or string.
COLUMNS: dict[str, list[tuple[str, str, bool]]] = {
    SNAPSHOT: [("key", "K", False), ("value", "V", False), ("lsn", "long", False)],
    CHANGES: [
        ("key", "K", False),
        ("value", "V", True),
        ("end_key", "K", True),
        ("_change_type", "string", False),
        ("_commit_version", "long", False),
        ("_commit_timestamp", "timestamp", False),
        ("_op_index", "int", False),
        ("keyspace", "string", False),
    ],
    STATE: [("key", "K", False), ("value", "V", False), ("lsn", "long", False), ("keyspace", "string", False)],
}
COLUMNS[SNAPSHOT].append(("keyspace", "string", False))
ALL_KEYSPACES = "*"
"""The option ``keyspace`` that reads every keyspace."""
Keyspaces = Container[str] | None
"""The keyspaces a read keeps (None: every one): a set, or :class:`LogOnly`."""


@dataclass(frozen=True)
class LogOnly:
    """The keyspaces of ``wanted`` (None: any) that are not in ``held``: those
    a read of ``*`` finds in the log alone, the snapshot holding no section of
    them (a keyspace created after it, or in a store without one)."""

    wanted: frozenset[str] | None
    held: frozenset[str]

    def __contains__(self, keyspace: object) -> bool:
        return keyspace not in self.held and (self.wanted is None or keyspace in self.wanted)

    @property
    def empty(self) -> bool:
        """Nothing can be in it: every wanted keyspace is held."""
        return self.wanted is not None and self.wanted <= self.held

_ARROW_KINDS = {
    BINARY: pa.binary(),
    STRING: pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}

ROWS_PER_BATCH = 65536


def columns(table: str, key_format: str = BINARY, value_format: str = BINARY) -> list[tuple[str, str, bool]]:
    """``(name, type, nullable)`` of a table, type one of binary, string,
    long, int, timestamp."""
    out = []
    for name, kind, nullable in COLUMNS[table]:
        if kind == "K":
            kind = key_format
        elif kind == "V":
            kind = value_format
        out.append((name, kind, nullable))
    return out


def arrow_schema(table: str, key_format: str = BINARY, value_format: str = BINARY) -> pa.Schema:
    return pa.schema(
        [pa.field(name, _ARROW_KINDS[kind], nullable=nullable) for name, kind, nullable in columns(table, key_format, value_format)]
    )


def as_format(arr: pa.Array, fmt: str, what: str, where: Callable[[], str]) -> pa.Array:
    if fmt == BINARY:
        return arr
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        bad = next(i for i, v in enumerate(arr.to_pylist()) if v is not None and not _is_utf8(v))
        raise ValueError(
            f"{what} {arr[bad].as_py()!r} is not valid UTF-8 ({where()}); "
            f"read it with option {what}Format=binary"
        ) from None


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


MAX_BATCH_BYTES = 64 << 20
"""Key and value bytes per record batch; well under the 2 GiB that 32-bit
Arrow offsets (Spark's ``binary``) allow, whatever the values' sizes."""

def binary_array(parts: Sequence[Sequence[bytes]]) -> pa.Array:
    """One ``binary`` array of the byte strings of ``parts`` (sequences of
    bytes, no nulls). (``pa.array`` on one list is as fast as building the
    buffers by hand: measured.)"""
    items = parts[0] if len(parts) == 1 else list(chain.from_iterable(parts))
    return pa.array(items, pa.binary())


def _binary(x: Any) -> pa.Array:
    if isinstance(x, pa.Array):
        return x
    return binary_array([x])


CONSTANTS_POOL = pa.system_memory_pool()
"""Where columns of one repeated value (a batch's LSN, keyspace, change
type) are allocated: malloc's heap, whose freed memory the next batch
reuses. pyarrow's default pool (mimalloc in its wheels) hands freed pages
back to the system within milliseconds, so every batch's constant columns
were new pages: 2,000-4,000 page faults per 559k-row snapshot chunk, about
7% of the CPU of reading it (measured in-process; none with this pool)."""


def repeat(value: Any, n: int) -> pa.Array:
    """``n`` times the scalar ``value`` (see :data:`CONSTANTS_POOL`)."""
    return pa.repeat(value, n, memory_pool=CONSTANTS_POOL)


# -- snapshot rows -----------------------------------------------------------


def snapshot_batch(
    keys: Sequence[bytes] | pa.Array,
    values: Sequence[bytes] | pa.Array,
    lsn: int,
    key_format: str,
    value_format: str,
    where: Callable[[], str],
    table: str = SNAPSHOT,
    keyspace: str = "",
) -> pa.RecordBatch:
    """One record batch of ``snapshot`` (or ``state``) rows of ``keyspace``, all at ``lsn``."""
    k = as_format(_binary(keys), key_format, "key", where)
    v = as_format(_binary(values), value_format, "value", where)
    n = len(k)
    lsns = repeat(pa.scalar(lsn, pa.int64()), n)
    return pa.RecordBatch.from_arrays([k, v, lsns, _constant(keyspace, n)],
                                      schema=arrow_schema(table, key_format, value_format))


def _constant(keyspace: str, n: int) -> pa.Array:
    return repeat(pa.scalar(keyspace, pa.string()), n)


def snapshot_change_batch(keys: pa.Array, values: pa.Array, lsn: int, timestamp_us: int, key_format: str,
                          value_format: str, where: Callable[[], str], keyspace: str = "") -> pa.RecordBatch:
    """Snapshot rows as ``changes`` rows (a stream's ``startingFrom=snapshot``):
    ``upsert`` at the snapshot's LSN and time, ``_op_index`` -1."""
    k = as_format(keys, key_format, "key", where)
    v = as_format(values, value_format, "value", where)
    n = len(k)
    nulls = pa.nulls(n, k.type)
    return pa.RecordBatch.from_arrays(
        [k, v, nulls, repeat(pa.scalar(UPSERT, pa.string()), n), repeat(pa.scalar(lsn, pa.int64()), n),
         repeat(pa.scalar(timestamp_us, pa.timestamp("us", tz="UTC")), n), repeat(pa.scalar(-1, pa.int32()), n),
         _constant(keyspace, n)],
        schema=arrow_schema(CHANGES, key_format, value_format),
    )


def state_batch(keys: Sequence[bytes], values: Sequence[bytes], lsns: Sequence[int], key_format: str,
                value_format: str, where: Callable[[], str], keyspace: str = "") -> pa.RecordBatch:
    k = as_format(binary_array([keys]), key_format, "key", where)
    v = as_format(binary_array([values]), value_format, "value", where)
    return pa.RecordBatch.from_arrays(
        [k, v, pa.array(lsns, pa.int64()), _constant(keyspace, len(k))],
        schema=arrow_schema(STATE, key_format, value_format)
    )


def keyspace_writes(ops: list[Any], wanted: Keyspaces, lsn: int, path: str | None = None,
                    read_back: ReadBack | None = None) -> Iterator[tuple[int, str, Any]]:
    """``(op index, keyspace, op)`` of the writes of one logged batch (put,
    delete, delete_range, expire) in the ``wanted`` keyspaces (None: every
    one): a put with a TTL or under a lease is shown as a put ``(1, key,
    value)``, its conditions change nothing, nor do lease ops, a failed
    batch nothing at all, and a drop of a keyspace is a ``delete_range`` of
    every key of it. A staged group's part or abort writes nothing; its
    commit writes the whole group, its parts read with ``read_back``
    (:func:`kvstore.entry.groups.entry_runs`). Anything else is damage."""
    if ops and group_code(ops) is not None:
        if read_back is None:
            raise ValueError("a staged group's entry needs read_back to be read")
        for offset, run in entry_runs(lsn, ops, read_back):
            for i, keyspace, op in keyspace_writes(run, wanted, lsn, path):  # type: ignore[arg-type]
                yield offset + i, keyspace, op
        return
    keyspace = ""  # a batch starts in the default keyspace
    for i, op in enumerate(ops):
        try:
            code = op[0]
            if code == OP_PUT or code == OP_DELETE or code == OP_DELETE_RANGE or code == OP_EXPIRE:
                if wanted is None or keyspace in wanted:
                    yield i, keyspace, op
            elif code in PUT_CODES:  # a put with a TTL or under a lease
                if wanted is None or keyspace in wanted:
                    yield i, keyspace, (OP_PUT, op[1], op[2])
            elif code in LEASE_CODES:
                continue  # a lease changed: no key did
            elif code == OP_KEYSPACE:
                keyspace = op[1]
            elif code == OP_DROP_KEYSPACE:
                if wanted is None or op[1] in wanted:
                    yield i, op[1], (OP_DELETE_RANGE, b"", END_OF_KEYS)
            elif code == OP_FAILED and i == 0:
                return  # a conditional batch that failed: nothing of it applies
            elif code not in CONDITION_CODES:  # a condition that held changes nothing
                raise bad_op(lsn, i, op, path)
        except (IndexError, TypeError):
            raise bad_op(lsn, i, op, path) from None


# -- change rows -------------------------------------------------------------

_TYPE_NAMES = pa.array(["", UPSERT, DELETE, DELETE_RANGE] + [""] * (OP_EXPIRE - 4) + [EXPIRE], pa.string())
"""Change type names by op code (puts with an expiry are shown as code 1)."""


def bad_op(lsn: int, index: int, op: Any, path: str | None) -> CorruptionError:
    return CorruptionError(
        f"operation {index} of the batch is not a put, delete or delete_range: {op!r:.80}",
        kind=Damage.CONTENT, path=path, lsn=lsn, hint="run `walkv verify STORE`",
    )


def change_batches(
    entries: Iterable[Any],
    decode: Callable[[bytes, int, str | None], list[Any]],
    key_format: str = BINARY,
    value_format: str = BINARY,
    path: str | None = None,
    rows_per_batch: int = ROWS_PER_BATCH,
    keyspaces: Keyspaces = frozenset([""]),
    read_back: ReadBack | None = None,
) -> Iterator[pa.RecordBatch]:
    """``changes`` rows of log entries (``(lsn, timestamp_us, payload)``),
    in LSN order and, within an entry, in batch order, of the keyspaces
    ``keyspaces`` (None: every one); ``read_back``: what reads a staged
    group's parts (:func:`keyspace_writes`)."""
    schema = arrow_schema(CHANGES, key_format, value_format)
    keys: list[bytes] = []
    values: list[bytes | None] = []
    ends: list[bytes | None] = []
    codes: list[int] = []
    lsns: list[int] = []
    stamps: list[int] = []
    idxs: list[int] = []
    spaces: list[str] = []
    first_lsn = [0]
    pending = 0

    def where() -> str:
        return f"{path}, LSNs {first_lsn[0]}..{lsns[-1] if lsns else first_lsn[0]}"

    def flush() -> pa.RecordBatch:
        k = as_format(binary_array([keys]), key_format, "key", where)
        v = as_format(pa.array(values, pa.binary()), value_format, "value", where)
        e = as_format(pa.array(ends, pa.binary()), key_format, "key", where)
        t = _TYPE_NAMES.take(pa.array(codes, pa.int8()))
        batch = pa.RecordBatch.from_arrays(
            [k, v, e, t, pa.array(lsns, pa.int64()), pa.array(stamps, pa.timestamp("us", tz="UTC")),
             pa.array(idxs, pa.int32()), pa.array(spaces, pa.string())],
            schema=schema,
        )
        for lst in (keys, values, ends, codes, lsns, stamps, idxs, spaces):
            lst.clear()
        return batch

    k_append, v_append, e_append = keys.append, values.append, ends.append
    c_append, l_append, s_append, i_append = codes.append, lsns.append, stamps.append, idxs.append
    for entry in entries:
        lsn, ts, payload = entry[0], entry[1], entry[2]
        if not lsns:
            first_lsn[0] = lsn
        ops = decode(payload, lsn, path)
        pending += len(payload)
        for i, keyspace, op in keyspace_writes(ops, keyspaces, lsn, path, read_back):
            code = op[0]
            if code == OP_PUT:
                key, value, end = op[1], op[2], None
            elif code == OP_DELETE or code == OP_EXPIRE:
                key, value, end = op[1], None, None
            else:
                key, value, end = op[1], None, op[2]
            spaces.append(keyspace)
            k_append(key)
            v_append(value)
            e_append(end)
            c_append(code)
            l_append(lsn)
            s_append(ts)
            i_append(i)
            if len(lsns) >= rows_per_batch:  # (a staged group's commit brings many)
                yield flush()
                pending = 0
        if len(lsns) >= rows_per_batch or pending >= MAX_BATCH_BYTES:
            yield flush()
            pending = 0
    if lsns:
        yield flush()
