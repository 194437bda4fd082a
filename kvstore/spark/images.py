"""Each change of the log with its key's value before and after it (pre- and post-images).

The one mechanism behind the formats that need a key's previous value:
``format=debezium`` (:mod:`kvstore.spark.debezium`: ``before``/``after``,
``c``/``u``/``d``) and ``changeVocabulary=delta`` (:mod:`kvstore.spark.delta_cdf`:
``insert``, ``update_preimage``/``update_postimage``, ``delete``). They
differ only in how they write an :class:`Image` as rows.

Exact, never a guess: every partition rebuilds the state of its key range at
the LSN before the first one it reports, from a snapshot at or before it plus
the log between them (the ``state`` table's merge), then applies the log in
order. So ``before`` is ``None`` exactly when the key did not exist. The base
is the snapshot the read starts from (a batch read's default: the newest; after
``startingLsn``/``startingTimestamp`` ``S``: the newest snapshot at or before
LSN ``S - 1``, or none, i.e. the empty store at LSN 0; ``snapshotLsn`` picks
it). When the log between that snapshot and ``S`` is gone (retention), the
read fails with :class:`~wal.errors.LogGapError` rather than guess. A stream
does the same for every micro-batch (from the newest snapshot at or before
the micro-batch's start), so its cost per micro-batch grows with the log
since the newest snapshot: take snapshots.

What makes no image: a delete of a key that did not exist, a range delete's
keys that did not exist, conditions, and a conditional batch whose conditions
failed (logged ``[7, i]``). A put of the value a key already has is a change
(it was written). A range delete makes one image per key it deleted, in key
order, all with the range delete's LSN and op index.

Partitions are the key ranges of the base snapshot's chunks (one partition
without a snapshot), of each keyspace read; with ``keyspace=*`` one more
follows the keyspaces the base holds no section of (created after it): the
images of a key come from one task, in (LSN, op index) order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple, Protocol

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

import snapshot
from kvstore.entry.codec import OP_DELETE, OP_DELETE_RANGE, OP_EXPIRE, OP_PUT
from kvstore.spark import arrow as sa
from kvstore.spark import snapshots as ss
from kvstore.spark.files import LogSlice, StoreFiles
from kvstore.spark.options import Options
from kvstore.spark.partitions import decode_batch, group_reader, plan


class Image(NamedTuple):
    """One change of one key: ``before`` ``None`` when the key did not exist,
    ``after`` ``None`` when the change deleted it. ``snapshot``: a row of the
    base snapshot (``startingFrom=snapshot``) at its LSN and time, op index -1."""

    key: bytes
    before: bytes | None
    after: bytes | None
    lsn: int
    timestamp_us: int
    op_index: int
    snapshot: bool
    keyspace: str = ""


class Shape(Protocol):
    """How a format writes images as rows: a builder of record batches."""

    def add(self, image: Image) -> None: ...

    def __len__(self) -> int: ...  # rows collected since the last flush

    def flush(self) -> pa.RecordBatch: ...


ShapeFactory = Callable[[Options, "str | None", str], Shape]  # (opts, store_id, where)


@dataclass(frozen=True)
class ImagePartition(InputPartition):
    """The images of the keys in ``[lo, hi)`` (``None``: unbounded) for LSNs
    ``emit_from ..`` the end of ``pieces``: the base state is the chunk of the
    snapshot in ``directory`` (or empty), ``pieces`` the log from the
    snapshot's LSN + 1; ``snapshot_rows``: report the chunk's rows too."""

    directory: str | None
    chunk: snapshot.ChunkInfo | None
    lo: bytes | None
    hi: bytes | None
    pieces: tuple[LogSlice, ...]
    emit_from: int
    snapshot_rows: bool
    created_us: int
    store_id: str | None
    keyspace: str = ""  # the keyspace of ``chunk``'s section
    follows: sa.Keyspaces = frozenset([""])  # the keyspaces whose changes it reports


def batch_partitions(files: StoreFiles, opts: Options) -> list[ImagePartition]:
    """The partitions of a batch read (on the driver)."""
    p = plan(files, opts)
    base = p.snapshot
    if opts.starting_lsn is not None or opts.starting_timestamp_us is not None:
        base = base_before(files, opts.snapshot_lsn, p.from_lsn)
    return partitions_from(files, opts, base, p.from_lsn, p.to_lsn, p.durable_lsn, opts.starting_from_snapshot)


def base_before(files: StoreFiles, snapshot_lsn: int | None, start: int) -> snapshot.Snapshot | None:
    """The snapshot the state before LSN ``start`` is rebuilt from: the one
    at ``snapshot_lsn`` when given (it must be before ``start``), else the
    newest at or before ``start - 1`` (``None``: the empty store at LSN 0)."""
    if snapshot_lsn is None:
        return ss.choose(files, None, start - 1)
    snap = ss.choose(files, snapshot_lsn, None)
    if snap is not None and snap.lsn >= start:
        raise ValueError(f"snapshotLsn {snapshot_lsn} is not before the first LSN read ({start}); the "
                         "before values are rebuilt from a snapshot before it: give a smaller one or leave it out")
    return snap


def partitions_from(files: StoreFiles, opts: Options, base: snapshot.Snapshot | None, emit_from: int, end: int,
                    durable: int, snapshot_rows: bool) -> list[ImagePartition]:
    """One partition per key range of ``base``'s chunks (one without chunks),
    each reading the log from ``base``'s LSN + 1 to ``end`` and reporting
    ``emit_from .. end`` (and ``base``'s rows when ``snapshot_rows``)."""
    snapshot_rows = snapshot_rows and base is not None
    if emit_from > end and not snapshot_rows:
        return []
    base_lsn = base.lsn if base is not None else 0
    pieces = tuple(files.plan_log(base_lsn + 1, end, durable, opts.max_partition_bytes))
    sid = files.store_id()
    wanted = opts.keyspaces
    held = ss.keyspaces_of(base, None) if base is not None else []
    out = []
    for ks in held:
        if wanted is not None and ks not in wanted:
            continue
        chunks = ss.keyspace_chunks(base, ks) if base is not None else ()
        if base is None or not chunks:
            out.append(ImagePartition(None, None, None, None, pieces, emit_from, False, 0, sid, ks, frozenset([ks])))
            continue
        out.extend(
            ImagePartition(base.path, chunk, None if i == 0 else chunk.first_key,
                           chunks[i + 1].first_key if i + 1 < len(chunks) else None, pieces, emit_from,
                           snapshot_rows, base.created_us, sid, ks, frozenset([ks]))
            for i, chunk in enumerate(chunks)
        )
    rest = sa.LogOnly(None if wanted is None else frozenset(wanted), frozenset(held))
    if not rest.empty:  # the keyspaces only the log holds (``*``), or the one read when the base has none
        out.append(ImagePartition(None, None, None, None, pieces, emit_from, False, 0, sid, "", rest))
    return out


def images(files: StoreFiles, opts: Options, p: ImagePartition) -> Iterator[Image]:
    """The images of one partition, in (LSN, op index, key) order (on an executor)."""
    states: dict[str, dict[bytes, bytes]] = {}
    if p.directory is not None and p.chunk is not None:
        chunk = p.chunk
        state = states[p.keyspace] = {}
        for keys, values in ss.read_chunk(files, p.directory, chunk, opts.rows_per_batch):
            for k, v in zip(chain.from_iterable(keys), chain.from_iterable(values)):
                key, value = bytes(k), bytes(v)
                state[key] = value
                if p.snapshot_rows:
                    yield Image(key, None, value, chunk.lsn, p.created_us, -1, True, p.keyspace)
    lo, hi = p.lo, p.hi
    read_back = group_reader(files)
    for piece in p.pieces:
        shown = files.display(piece.path)
        for entry in files.iter_slice(piece):
            lsn, ts, emit = entry.lsn, entry.timestamp_us, entry.lsn >= p.emit_from
            ops = decode_batch(entry.payload, lsn, shown)
            for i, keyspace, op in sa.keyspace_writes(ops, p.follows, lsn, shown, read_back):
                state = states.setdefault(keyspace, {})  # a key's previous value is in its own keyspace
                code, a = op[0], op[1]
                if code == OP_EXPIRE:  # the key's TTL or lease ran out: as a delete
                    code = OP_DELETE
                b: bytes = op[2] if code != OP_DELETE else b""
                if code == OP_PUT or code == OP_DELETE:
                    if (lo is not None and a < lo) or (hi is not None and a >= hi):
                        continue
                    before = state.get(a)
                    if code == OP_PUT:
                        state[a] = b
                        if emit:
                            yield Image(a, before, b, lsn, ts, i, False, keyspace)
                    elif before is not None:
                        del state[a]
                        if emit:
                            yield Image(a, before, None, lsn, ts, i, False, keyspace)
                elif code == OP_DELETE_RANGE:
                    for key in sorted(k for k in state if a <= k < b):
                        before = state.pop(key)
                        if emit:
                            yield Image(key, before, None, lsn, ts, i, False, keyspace)


def read(files: StoreFiles, opts: Options, p: ImagePartition, shape: ShapeFactory) -> Iterator[pa.RecordBatch]:
    """The record batches of one partition in the format ``shape`` writes:
    at most about ``rowsPerBatch`` rows or :data:`~kvstore.spark.arrow.MAX_BATCH_BYTES`
    of keys and values each."""
    out = shape(opts, p.store_id, files.display())
    size = 0
    for image in images(files, opts, p):
        out.add(image)
        size += len(image.key) + len(image.before or b"") + len(image.after or b"")
        if len(out) >= opts.rows_per_batch or size >= sa.MAX_BATCH_BYTES:
            yield out.flush()
            size = 0
    if len(out):
        yield out.flush()
