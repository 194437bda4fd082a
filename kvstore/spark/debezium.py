"""``changes`` as Debezium-shaped change events (the option ``format=debezium``).

For people who feed Kafka: one row per change of one key, shaped like the
envelope of a Debezium change event::

    spark.read.format("walkv").option("format", "debezium").load(path)
    spark.readStream.format("walkv").option("format", "debezium").load(path)

Columns (``K``/``V`` binary or string as ``keyFormat``/``valueFormat``):

``key``      K not null: the Kafka message key
``before``   V: the key's value just before the change (null when it had none)
``after``    V: its value after the change (null for ``d``)
``source``   struct not null: ``store_id`` string (null only for a store whose
             log has no segment), ``lsn`` bigint not null (the log entry; for
             ``r``: the snapshot's LSN), ``ts_ms`` bigint not null (its commit
             time, ms since the epoch; for ``r``: the snapshot's time),
             ``op_index`` int not null (the operation's position in its
             batch; -1 for ``r``), ``snapshot`` boolean not null (true for ``r``),
             ``keyspace`` string not null (the key's keyspace, "" the default
             one: Debezium's ``source.table``; ``keyspace=*`` reads every one)
``op``       string not null: ``c`` a put of a key that did not exist, ``u`` a
             put of one that did, ``d`` a delete of one that did, ``r`` a row
             of the snapshot the read starts from (``startingFrom=snapshot``)
``ts_ms``    bigint not null: the same commit time as ``source.ts_ms``

``before`` and the ``c``/``u``/``d`` choice are exact: they come from
:mod:`kvstore.spark.images` (each partition rebuilds its key range's state
from the snapshot at or before the first LSN read plus the log up to it), so
``before`` is never "unknown": null means the key did not exist. A read whose
history retention deleted fails with :class:`~wal.errors.LogGapError`.

What makes no event: a put of the value a key already has still makes a
``u`` (it was written); a delete of a key that did not exist, a range delete's
keys that did not exist, conditions, and a conditional batch whose conditions
failed (logged ``[7, i]``) make none. A range delete makes one ``d`` per key
it deleted, in key order, all with the range delete's ``lsn`` and
``op_index``: Kafka consumers (and log compaction) work per key, and a single
range event would need every consumer to know the key space.

Partitions are the key ranges of the base snapshot's chunks (one partition
without a snapshot): the events of a key come from one task, in (lsn,
op_index) order, so writing them to Kafka keyed by ``key`` keeps per-key
order. Debezium's tombstone after a delete is Kafka's business (a null
message for the key), not a row here.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from kvstore.spark import arrow as sa
from kvstore.spark.images import Image
from kvstore.spark.options import Options

CREATE, UPDATE, DELETE, READ = "c", "u", "d", "r"

SOURCE_FIELDS = [
    pa.field("store_id", pa.string(), nullable=True),
    pa.field("lsn", pa.int64(), nullable=False),
    pa.field("ts_ms", pa.int64(), nullable=False),
    pa.field("op_index", pa.int32(), nullable=False),
    pa.field("snapshot", pa.bool_(), nullable=False),
    pa.field("keyspace", pa.string(), nullable=False),
]


def arrow_schema(key_format: str = sa.BINARY, value_format: str = sa.BINARY) -> pa.Schema:
    """The events' schema (see the module docstring); record batches have exactly these types."""
    k = pa.string() if key_format == sa.STRING else pa.binary()
    v = pa.string() if value_format == sa.STRING else pa.binary()
    return pa.schema([
        pa.field("key", k, nullable=False),
        pa.field("before", v, nullable=True),
        pa.field("after", v, nullable=True),
        pa.field("source", pa.struct(SOURCE_FIELDS), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("ts_ms", pa.int64(), nullable=False),
    ])


class Events:
    """Events collected into record batches of the declared schema (an
    :class:`~kvstore.spark.images.Shape`)."""

    def __init__(self, opts: Options, store_id: str | None, where: str) -> None:
        self.kf, self.vf, self.where = opts.key_format, opts.value_format, where
        self.schema = arrow_schema(self.kf, self.vf)
        self.store_id = store_id
        self.cols: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [], [])

    def add(self, image: Image) -> None:
        key, before, after, lsn, ts_us, index, snap, keyspace = image
        op = READ if snap else DELETE if after is None else CREATE if before is None else UPDATE
        for col, x in zip(self.cols, (key, before, after, op, lsn, ts_us // 1000, index, snap, keyspace)):
            col.append(x)

    def __len__(self) -> int:
        return len(self.cols[0])

    def flush(self) -> pa.RecordBatch:
        keys, befores, afters, ops, lsns, stamps, idxs, snaps, spaces = self.cols
        n = len(keys)

        def where() -> str:
            return f"{self.where}, LSNs {lsns[0]}..{lsns[-1]}"

        ts = pa.array(stamps, pa.int64())
        source = pa.StructArray.from_arrays(
            [pa.array([self.store_id] * n, pa.string()), pa.array(lsns, pa.int64()), ts,
             pa.array(idxs, pa.int32()), pa.array(snaps, pa.bool_()), pa.array(spaces, pa.string())],
            fields=SOURCE_FIELDS,
        )
        batch = pa.RecordBatch.from_arrays(
            [sa.as_format(pa.array(keys, pa.binary()), self.kf, "key", where),
             sa.as_format(pa.array(befores, pa.binary()), self.vf, "value", where),
             sa.as_format(pa.array(afters, pa.binary()), self.vf, "value", where),
             source, pa.array(ops, pa.string()), ts],
            schema=self.schema,
        )
        for col in self.cols:
            col.clear()
        return batch
