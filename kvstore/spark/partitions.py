"""Planning a walkv read into input partitions (on the driver) and reading one (on an executor).

Planning happens once, on the driver: the durable LSN is read then and bounds
every partition, so a query never reads past it and sees one consistent LSN
range however long its tasks take. Partitions: one per snapshot chunk and one
per log segment (large sealed segments split at sparse-index points); a
``state`` read has one per snapshot chunk's key range, each applying the log
tail to its range. Each partition holds everything its task needs; the
:class:`~kvstore.spark.files.StoreFiles` it is read with pickles as the
store's location only. Tasks yield ``pyarrow.RecordBatch``\\ es whose types
are exactly the schema's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

import snapshot
from kvstore.entry.codec import decode
from kvstore.entry.groups import ReadBack
from kvstore.spark import arrow as sa
from kvstore.spark import snapshots as ss
from kvstore.spark.files import LogSlice, StoreFiles
from kvstore.spark.options import EARLIEST, LATEST, Options
from kvstore.spark.pushdown import Bounds
from kvstore.spark.tail_state import TailState
from wal.errors import CorruptionError

log = logging.getLogger("walkv.spark")


@dataclass(frozen=True)
class ChunkPartition(InputPartition):
    """One chunk of the snapshot in ``directory``: ``snapshot`` rows."""

    directory: str
    chunk: snapshot.ChunkInfo
    bounds: Bounds | None = None  # pushed-down key bounds: only these rows
    keyspace: str = ""  # the keyspace whose section the chunk is of


@dataclass(frozen=True)
class SnapshotChangesPartition(InputPartition):
    """One chunk of the snapshot in ``directory`` as ``changes`` rows (a
    stream's ``startingFrom=snapshot``), stamped with the snapshot's time."""

    directory: str
    chunk: snapshot.ChunkInfo
    created_us: int
    keyspace: str = ""


@dataclass(frozen=True)
class LogPartition(InputPartition):
    """A run of LSNs inside one segment: ``changes`` rows of ``keyspaces`` (None: every one)."""

    piece: LogSlice
    keyspaces: frozenset[str] | None = frozenset([""])


@dataclass(frozen=True)
class StatePartition(InputPartition):
    """The keys in ``[lo, hi)`` (``None``: unbounded): the rows of one chunk
    of the snapshot in ``directory`` (or none) with the log tail ``pieces``
    applied."""

    directory: str | None
    chunk: snapshot.ChunkInfo | None
    lo: bytes | None
    hi: bytes | None
    pieces: tuple[LogSlice, ...]
    bounds: Bounds | None = None  # pushed-down key bounds: only these rows
    keyspace: str = ""  # the keyspace it computes


@dataclass(frozen=True)
class LogStatePartition(InputPartition):
    """The keys in ``[lo, hi)`` of the keyspaces ``keyspaces`` no snapshot
    section holds (a read of ``*``): their state is the log tail ``pieces``
    alone."""

    lo: bytes | None
    hi: bytes | None
    pieces: tuple[LogSlice, ...]
    keyspaces: sa.LogOnly
    bounds: Bounds | None = None


@dataclass(frozen=True)
class ReadPlan:
    """What one batch query reads, fixed once: the snapshot, the LSN range of
    the log (inclusive), and the durable LSN it was planned against."""

    snapshot: snapshot.Snapshot | None
    from_lsn: int
    to_lsn: int
    durable_lsn: int


def plan(files: StoreFiles, opts: Options) -> ReadPlan:
    """Choose the snapshot and the LSN range for a batch read."""
    files.check_store()
    durable = files.durable_lsn()
    if opts.ending_lsn is not None and opts.ending_lsn > durable:
        raise ValueError(
            f"endingLsn {opts.ending_lsn} is past the durable LSN {durable} of {files.display()}; "
            "entries past it may still be lost to a crash, so they are not read"
        )
    ending = opts.ending_lsn
    if opts.ending_timestamp_us is not None:
        ending = files.last_lsn_at(opts.ending_timestamp_us, durable)
    end = durable if ending is None else ending
    snap: snapshot.Snapshot | None = None
    from_log = opts.table == sa.CHANGES and (opts.starting_lsn is not None or opts.starting_timestamp_us is not None)
    if not from_log:
        snap = ss.choose(files, opts.snapshot_lsn, ending if opts.table != sa.SNAPSHOT else None)
    if opts.starting_timestamp_us is not None:
        start = files.last_lsn_at(opts.starting_timestamp_us - 1, durable) + 1
    elif from_log:
        start = starting_lsn(files, opts.starting_lsn, durable)
    else:
        start = (snap.lsn if snap is not None else 0) + 1
    if from_log:
        start = skip_lost(files, opts, start, end, durable)
    elif opts.table == sa.CHANGES and snap is not None and start > end and ending is None \
            and opts.snapshot_lsn is None:
        _say_empty_after_snapshot(files, snap, end)
    return ReadPlan(snap, start, end, durable)


def _say_empty_after_snapshot(files: StoreFiles, snap: snapshot.Snapshot, end: int) -> None:
    """A batch read of ``changes`` by default reads the LSNs after the newest
    snapshot: right after a snapshot (an automatic one, say) that is none,
    though the log still holds the LSNs before it. Say so, and how to read them."""
    first = files.first_held(end)
    if first > snap.lsn:
        return  # the log holds nothing before the snapshot either
    log.warning("table=changes of %s has no rows: a batch read covers the LSNs after the newest snapshot (at LSN "
                "%d) up to the durable LSN %d, and the snapshot is that recent. The log still holds LSNs %d..%d: "
                "read them with option startingLsn (a number, or earliest) or startingTimestamp",
                files.display(), snap.lsn, end, first, end)


def starting_lsn(files: StoreFiles, option: int | str | None, durable: int) -> int:
    """The first LSN ``startingLsn`` names (a number, earliest or latest)."""
    if option == EARLIEST or option is None:
        return files.first_held(durable)
    if option == LATEST:
        return durable + 1
    return int(option)


def skip_lost(files: StoreFiles, opts: Options, start: int, end: int, durable: int) -> int:
    """``start``, or with ``failOnDataLoss=false`` the first LSN the log holds
    when retention deleted ``start`` (a warning names the skipped LSNs);
    with the default the read fails later with the ``LogGapError``."""
    first_held = files.first_held(durable)
    if start >= first_held or opts.fail_on_data_loss or end < start:
        return start
    log.warning("failOnDataLoss=false: LSNs %d..%d are no longer in the log of %s (retention deleted them); "
                "reading from LSN %d", start, first_held - 1, files.display(), first_held)
    return first_held


def _max(a: bytes | None, b: bytes | None) -> bytes | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: bytes | None, b: bytes | None) -> bytes | None:
    return b if a is None else a if b is None else min(a, b)


def partitions_for(files: StoreFiles, opts: Options, p: ReadPlan, bounds: Bounds | None = None) -> list[Any]:
    """The input partitions of a planned batch read; with pushed-down
    ``bounds`` (:mod:`kvstore.spark.pushdown`), only the snapshot chunks and
    log slices that can hold matching rows."""
    b = bounds if bounds is not None else Bounds()
    if b.empty:
        return []
    keyed = b if b.on_keys else None
    wanted = b.within(opts.keyspaces)
    if opts.table == sa.SNAPSHOT:
        if p.snapshot is None:
            return []
        snap = p.snapshot
        return [ChunkPartition(snap.path, c, keyed, ks) for ks in ss.keyspaces_of(snap, wanted)
                for c in ss.keyspace_chunks(snap, ks) if b.chunk_may_match(c)]
    if opts.table == sa.CHANGES:
        first, last = b.lsn_range(p.from_lsn, p.to_lsn)
        return [LogPartition(piece, wanted) for piece in files.plan_log(first, last, p.durable_lsn, *opts.log_split())]
    # state: one task per snapshot chunk's key range (of its keyspace's section), covering every key;
    # with ``*``, one more for the keyspaces only the log tail holds.
    pieces = tuple(files.plan_log(p.from_lsn, p.to_lsn, p.durable_lsn, opts.max_partition_bytes))
    held = ss.keyspaces_of(p.snapshot, None) if p.snapshot is not None else []
    out: list[Any] = []
    for ks in held:
        if wanted is None or ks in wanted:
            out.extend(_state_partitions(p.snapshot, ks, pieces, b, keyed))
    rest = sa.LogOnly(None if wanted is None else frozenset(wanted), frozenset(held))
    if not rest.empty:
        out.append(LogStatePartition(b.lo, b.hi, pieces, rest, keyed))
    return out


def _state_partitions(snap: snapshot.Snapshot | None, ks: str, pieces: tuple[LogSlice, ...], b: Bounds,
                      keyed: Bounds | None) -> list[StatePartition]:
    """The ``state`` partitions of keyspace ``ks``, a section of ``snap``."""
    chunks = ss.keyspace_chunks(snap, ks) if snap is not None else ()
    if snap is None or not chunks:
        return [StatePartition(snap.path if snap else None, None, b.lo, b.hi, pieces, keyed, ks)]
    out = []
    for i, chunk in enumerate(chunks):
        lo = None if i == 0 else chunk.first_key
        hi = chunks[i + 1].first_key if i + 1 < len(chunks) else None
        lo, hi = _max(lo, b.lo), _min(hi, b.hi)
        if lo is not None and hi is not None and lo >= hi:
            continue
        if b.keys is not None and not any((lo is None or k >= lo) and (hi is None or k < hi) for k in b.keys):
            continue
        out.append(StatePartition(snap.path, chunk, lo, hi, pieces, keyed, ks))
    return out


def _only(bounds: Bounds | None, keys: pa.Array, values: pa.Array) -> tuple[pa.Array, pa.Array]:
    mask = bounds.key_mask(keys) if bounds is not None else None
    if mask is None:
        return keys, values
    return keys.filter(mask), values.filter(mask)


def decode_batch(payload: bytes, lsn: int, path: str | None = None) -> list[list[Any]]:
    """One log entry's batch (the format :mod:`kvstore.entry.codec` owns), its
    damage naming the segment ``path``."""
    try:
        return decode(payload, lsn)
    except CorruptionError as exc:
        if path is None or exc.path is not None:
            raise
        raise CorruptionError(exc.reason, kind=exc.kind, path=path, offset=exc.offset, lsn=exc.lsn,
                              hint="run `walkv verify STORE`") from None


def group_reader(files: StoreFiles) -> ReadBack:
    """What reads a staged group's parts back from ``files`` (the LSNs
    right before its commit: :mod:`kvstore.entry.groups`), through the
    same entry reader as every partition, wherever the planner cut."""

    def read_back(first: int, last: int) -> Iterator[tuple[int, list[list[Any]]]]:
        for piece in files.plan_log(first, last, last, 1 << 62):
            shown = files.display(piece.path)
            for entry in files.iter_slice(piece):
                yield entry.lsn, decode_batch(entry.payload, entry.lsn, shown)
    return read_back


def read_partition(files: StoreFiles, opts: Options, partition: Any) -> Iterator[Any]:
    """The record batches of one partition (on an executor)."""
    kf, vf, rows = opts.key_format, opts.value_format, opts.rows_per_batch
    if isinstance(partition, LogPartition):
        piece = partition.piece
        yield from sa.change_batches(
            files.iter_slice(piece), decode_batch, kf, vf, files.display(piece.path), rows, partition.keyspaces,
            group_reader(files),
        )
    elif isinstance(partition, ChunkPartition):
        directory, chunk = partition.directory, partition.chunk
        for keys, values in ss.read_chunk_arrays(files, directory, chunk, rows):
            k, v = _only(partition.bounds, keys, values)
            yield sa.snapshot_batch(k, v, chunk.lsn, kf, vf, lambda: ss.where(files, directory, chunk),
                                    keyspace=partition.keyspace)
    elif isinstance(partition, SnapshotChangesPartition):
        d, c, t = partition.directory, partition.chunk, partition.created_us
        for keys, values in ss.read_chunk_arrays(files, d, c, rows):
            yield sa.snapshot_change_batch(keys, values, c.lsn, t, kf, vf,
                                           lambda: ss.where(files, d, c), partition.keyspace)
    elif isinstance(partition, StatePartition):
        yield from _read_state_partition(files, opts, partition)
    elif isinstance(partition, LogStatePartition):
        yield from _read_log_state_partition(files, opts, partition)
    elif partition is None or type(partition) is InputPartition:
        return  # Spark's placeholder when a plan has no partitions: no rows
    else:
        raise TypeError(f"not a walkv partition: {partition!r}")


def _read_state_partition(files: StoreFiles, opts: Options, p: StatePartition) -> Iterator[Any]:
    tail = TailState(p.lo, p.hi, p.keyspace)
    read_back = group_reader(files)
    for piece in p.pieces:
        shown = files.display(piece.path)
        for entry in files.iter_slice(piece):
            tail.add(entry.lsn, decode_batch(entry.payload, entry.lsn, shown), shown, read_back)
    kf, vf = opts.key_format, opts.value_format
    if p.directory is not None and p.chunk is not None:
        directory, chunk = p.directory, p.chunk

        def where() -> str:
            return ss.where(files, directory, chunk)

        for keys, values in ss.read_chunk_arrays(files, directory, chunk, opts.rows_per_batch):
            k, v = tail.filter_snapshot(*_only(p.bounds, keys, values))
            if len(k):
                yield sa.snapshot_batch(k, v, chunk.lsn, kf, vf, where, sa.STATE, p.keyspace)
    yield from _survivor_batches(files, opts, tail, p.bounds, p.keyspace)


def _survivor_batches(files: StoreFiles, opts: Options, tail: TailState, bounds: Bounds | None,
                      keyspace: str) -> Iterator[pa.RecordBatch]:
    """The ``state`` rows the log tail wrote last (of one keyspace)."""
    keys_, values_, lsns = tail.survivors()
    if bounds is not None and bounds.keys is not None:
        kept = [i for i, k in enumerate(keys_) if k in bounds.keys]
        keys_, values_, lsns = [keys_[i] for i in kept], [values_[i] for i in kept], [lsns[i] for i in kept]
    for i in range(0, len(keys_), opts.rows_per_batch):
        j = i + opts.rows_per_batch
        yield sa.state_batch(keys_[i:j], values_[i:j], lsns[i:j], opts.key_format, opts.value_format,
                             lambda: f"{files.display()}, log tail", keyspace)


def _read_log_state_partition(files: StoreFiles, opts: Options, p: LogStatePartition) -> Iterator[Any]:
    tails: dict[str, TailState] = {}
    read_back = group_reader(files)
    for piece in p.pieces:
        shown = files.display(piece.path)
        for entry in files.iter_slice(piece):
            lsn = entry.lsn
            ops = decode_batch(entry.payload, lsn, shown)
            for i, ks, op in sa.keyspace_writes(ops, p.keyspaces, lsn, shown, read_back):
                tail = tails.get(ks)
                if tail is None:
                    tail = tails[ks] = TailState(p.lo, p.hi, ks)
                tail.add_write(lsn, i, op)
    for ks in sorted(tails):
        yield from _survivor_batches(files, opts, tails[ks], p.bounds, ks)
