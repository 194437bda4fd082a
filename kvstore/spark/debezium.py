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
             batch; -1 for ``r``), ``snapshot`` boolean not null (true for ``r``)
``op``       string not null: ``c`` a put of a key that did not exist, ``u`` a
             put of one that did, ``d`` a delete of one that did, ``r`` a row
             of the snapshot the read starts from (``startingFrom=snapshot``)
``ts_ms``    bigint not null: the same commit time as ``source.ts_ms``

``before`` and the ``c``/``u``/``d`` choice are exact: every partition
rebuilds the state of its key range at the LSN before the first one it
reports, from a snapshot at or before it plus the log between them (the
``state`` table's merge), then applies the log in order. So ``before`` is
never "unknown": null means the key did not exist. The base is the snapshot
the read starts from (a batch read's default: the newest; after
``startingLsn``/``startingTimestamp`` ``S``: the newest snapshot at or before
LSN ``S - 1``, or none, i.e. the empty store at LSN 0; ``snapshotLsn`` picks
it). When the log between that snapshot and ``S`` is gone (retention), the
read fails with :class:`~wal.errors.LogGapError` rather than guess. A stream
does the same for every micro-batch (from the newest snapshot at or before
the micro-batch's start), so its cost per micro-batch grows with the log
since the newest snapshot: take snapshots.

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

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

import snapshot
from kvstore.entry.codec import CONDITION_CODES, OP_DELETE, OP_DELETE_RANGE, OP_FAILED, OP_PUT
from kvstore.spark import arrow as sa
from kvstore.spark import snapshots as ss
from kvstore.spark.files import LogSlice, StoreFiles
from kvstore.spark.options import Options
from kvstore.spark.partitions import decode_batch, plan

CREATE, UPDATE, DELETE, READ = "c", "u", "d", "r"

SOURCE_FIELDS = [
    pa.field("store_id", pa.string(), nullable=True),
    pa.field("lsn", pa.int64(), nullable=False),
    pa.field("ts_ms", pa.int64(), nullable=False),
    pa.field("op_index", pa.int32(), nullable=False),
    pa.field("snapshot", pa.bool_(), nullable=False),
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


@dataclass(frozen=True)
class DebeziumPartition(InputPartition):
    """The events of the keys in ``[lo, hi)`` (``None``: unbounded) for LSNs
    ``emit_from ..`` the end of ``pieces``: the base state is the chunk of the
    snapshot in ``directory`` (or empty), ``pieces`` the log from the
    snapshot's LSN + 1; ``snapshot_rows``: report the chunk's rows as ``r``."""

    directory: str | None
    chunk: snapshot.ChunkInfo | None
    lo: bytes | None
    hi: bytes | None
    pieces: tuple[LogSlice, ...]
    emit_from: int
    snapshot_rows: bool
    created_us: int
    store_id: str | None


def batch_partitions(files: StoreFiles, opts: Options) -> list[DebeziumPartition]:
    """The partitions of a batch read (on the driver)."""
    p = plan(files, opts)
    base = p.snapshot
    if opts.starting_lsn is not None or opts.starting_timestamp_us is not None:
        base = base_before(files, opts.snapshot_lsn, p.from_lsn)
    return event_partitions(files, opts, base, p.from_lsn, p.to_lsn, p.durable_lsn, opts.starting_from_snapshot)


def base_before(files: StoreFiles, snapshot_lsn: int | None, start: int) -> snapshot.Snapshot | None:
    """The snapshot the state before LSN ``start`` is rebuilt from: the one
    at ``snapshot_lsn`` when given (it must be before ``start``), else the
    newest at or before ``start - 1`` (``None``: the empty store at LSN 0)."""
    if snapshot_lsn is None:
        return ss.choose(files, None, start - 1)
    snap = ss.choose(files, snapshot_lsn, None)
    if snap is not None and snap.lsn >= start:
        raise ValueError(f"snapshotLsn {snapshot_lsn} is not before the first LSN read ({start}); the events' "
                         "before values are rebuilt from a snapshot before it: give a smaller one or leave it out")
    return snap


def event_partitions(files: StoreFiles, opts: Options, base: snapshot.Snapshot | None, emit_from: int, end: int,
                     durable: int, snapshot_rows: bool) -> list[DebeziumPartition]:
    """One partition per key range of ``base``'s chunks (one without chunks),
    each reading the log from ``base``'s LSN + 1 to ``end`` and reporting
    ``emit_from .. end`` (and ``base``'s rows as ``r`` when ``snapshot_rows``)."""
    snapshot_rows = snapshot_rows and base is not None
    if emit_from > end and not snapshot_rows:
        return []
    base_lsn = base.lsn if base is not None else 0
    pieces = tuple(files.plan_log(base_lsn + 1, end, durable, opts.max_partition_bytes))
    sid = files.store_id()
    if base is None or not base.chunks:
        return [DebeziumPartition(None, None, None, None, pieces, emit_from, False, 0, sid)]
    chunks = base.chunks
    return [
        DebeziumPartition(base.path, chunk, None if i == 0 else chunk.first_key,
                          chunks[i + 1].first_key if i + 1 < len(chunks) else None, pieces, emit_from,
                          snapshot_rows, base.created_us, sid)
        for i, chunk in enumerate(chunks)
    ]


class _Events:
    """Events collected into record batches of the declared schema."""

    def __init__(self, opts: Options, store_id: str | None, where: str) -> None:
        self.kf, self.vf, self.rows, self.where = opts.key_format, opts.value_format, opts.rows_per_batch, where
        self.schema = arrow_schema(self.kf, self.vf)
        self.store_id = store_id
        self.cols: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [])

    def add(self, key: bytes, before: bytes | None, after: bytes | None, op: str, lsn: int, ts_ms: int,
            index: int, snap: bool) -> None:
        for col, x in zip(self.cols, (key, before, after, op, lsn, ts_ms, index, snap)):
            col.append(x)

    def full(self) -> bool:
        return len(self.cols[0]) >= self.rows

    def flush(self) -> pa.RecordBatch:
        keys, befores, afters, ops, lsns, stamps, idxs, snaps = self.cols
        n = len(keys)

        def where() -> str:
            return f"{self.where}, LSNs {lsns[0]}..{lsns[-1]}"

        ts = pa.array(stamps, pa.int64())
        source = pa.StructArray.from_arrays(
            [pa.array([self.store_id] * n, pa.string()), pa.array(lsns, pa.int64()), ts,
             pa.array(idxs, pa.int32()), pa.array(snaps, pa.bool_())],
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


def read_events(files: StoreFiles, opts: Options, p: DebeziumPartition) -> Iterator[pa.RecordBatch]:
    """The record batches of one partition (on an executor)."""
    state: dict[bytes, bytes] = {}
    out = _Events(opts, p.store_id, files.display())
    if p.directory is not None and p.chunk is not None:
        chunk = p.chunk
        ts_ms = p.created_us // 1000
        for keys, values in ss.read_chunk(files, p.directory, chunk, opts.rows_per_batch):
            for k, v in zip(chain.from_iterable(keys), chain.from_iterable(values)):
                key, value = bytes(k), bytes(v)
                state[key] = value
                if p.snapshot_rows:
                    out.add(key, None, value, READ, chunk.lsn, ts_ms, -1, True)
                    if out.full():
                        yield out.flush()
    lo, hi = p.lo, p.hi
    for piece in p.pieces:
        shown = files.display(piece.path)
        for entry in files.iter_slice(piece):
            lsn, ts_ms, emit = entry.lsn, entry.timestamp_us // 1000, entry.lsn >= p.emit_from
            ops = decode_batch(entry.payload, lsn, shown)
            for i, op in enumerate(ops):
                try:
                    code = op[0]
                    if code == OP_PUT or code == OP_DELETE:
                        key = op[1]
                        if (lo is not None and key < lo) or (hi is not None and key >= hi):
                            continue
                        before = state.get(key)
                        if code == OP_PUT:
                            state[key] = op[2]
                            if emit:
                                out.add(key, before, op[2], CREATE if before is None else UPDATE, lsn, ts_ms, i, False)
                        elif before is not None:
                            del state[key]
                            if emit:
                                out.add(key, before, None, DELETE, lsn, ts_ms, i, False)
                    elif code == OP_DELETE_RANGE:
                        start, end = op[1], op[2]
                        for key in sorted(k for k in state if start <= k < end):
                            before = state.pop(key)
                            if emit:
                                out.add(key, before, None, DELETE, lsn, ts_ms, i, False)
                    elif code in CONDITION_CODES:
                        continue  # a condition that held changes nothing
                    elif code == OP_FAILED and i == 0:
                        break  # a conditional batch that failed: nothing of it applies
                    else:
                        raise sa.bad_op(lsn, i, op, shown)
                except (IndexError, TypeError):
                    raise sa.bad_op(lsn, i, op, shown) from None
            if out.full():
                yield out.flush()
    if out.cols[0]:
        yield out.flush()
