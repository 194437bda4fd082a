"""walkv's Spark data source: read a store's snapshot, log and state in parallel.

PySpark 4 Python data source (``pyspark.sql.datasource``), registered under
the name ``walkv``. It reads the store's files directly (no LMDB, no running
database) through ``pyarrow.fs``, so a store on a local disk, HDFS or S3 is
read as the cluster sees it::

    from kvstore.spark import register
    register(spark)
    spark.read.format("walkv").option("table", "snapshot").load(path)   # key, value, lsn
    spark.read.format("walkv").option("table", "changes").load(path)    # the log after it
    spark.read.format("walkv").option("table", "state").load(path)      # current contents
    spark.readStream.format("walkv").load(path)                         # the log, as a stream

Columns are described in :mod:`kvstore.spark.arrow`, options in
:mod:`kvstore.spark.options`. :func:`read_state` computes the state with
DataFrame operations (a window over (lsn, op index) per key, and a range
join for range deletes); ``table=state`` computes the same inside the scan,
one task per snapshot chunk's key range, each applying the log tail to its
range.

Planning happens once, on the driver: the durable LSN is read then and bounds
every partition, so a query never reads past it, and sees one consistent
LSN range however long its tasks take. Partitions: one per snapshot chunk and
one per log segment (large sealed segments split at sparse-index points).
Tasks yield ``pyarrow.RecordBatch``es whose types are exactly the schema's.

Streams: offsets are ``{"lsn": n, "store": id}``, ``n`` the last LSN the
micro-batch includes; a checkpoint taken against another store is refused.
A stream never reads past the durable LSN, and if retention deleted the
segments holding LSNs it still needs it fails with :class:`LogGapError`
naming them.

pyspark is imported when this module is; ``import kvstore`` does not import
it. Install the extra: ``pip install 'walkv[spark]'``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

try:
    from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "kvstore.spark needs PySpark 4 (pyspark.sql.datasource) and pyarrow: pip install 'walkv[spark]'"
    ) from exc

from wal.errors import CorruptionError

from kvstore.spark import arrow as sa
from kvstore.batch import decode as _decode
from kvstore.spark import snapshots as ss
from kvstore.spark.files import LogGapError, LogSlice, StoreFiles, normalize_location
from kvstore.spark.options import EARLIEST, LATEST, Options, parse

__all__ = [
    "LogGapError",
    "WalkvDataSource",
    "read_state",
    "register",
    "spark_schema",
]

NAME = "walkv"


def register(spark: Any) -> None:
    """Register the ``walkv`` data source with a SparkSession."""
    spark.dataSource.register(WalkvDataSource)


def spark_schema(table: str, key_format: str = sa.BINARY, value_format: str = sa.BINARY) -> Any:
    """The Spark ``StructType`` of a table (see :mod:`kvstore.spark.arrow`)."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    kinds = {
        sa.BINARY: BinaryType(),
        sa.STRING: StringType(),
        "long": LongType(),
        "int": IntegerType(),
        "timestamp": TimestampType(),
    }
    return StructType(
        [StructField(name, kinds[kind], nullable) for name, kind, nullable in sa.columns(table, key_format, value_format)]
    )


def _decode_batch(payload: bytes, lsn: int | None = None, path: str | None = None) -> list:
    """Decode one log entry's batch (the format kvstore.batch owns)."""
    try:
        return _decode(payload, lsn)
    except CorruptionError as exc:
        if path is None or exc.path is not None:
            raise
        raise CorruptionError(exc.reason, path=path, lsn=exc.lsn, hint="run `walkv verify STORE`") from None


# -- partitions ----------------------------------------------------------------
# Each holds everything its task needs; the StoreFiles it is read with pickles
# as the store's URI only.


@dataclass(frozen=True)
class ChunkPartition(InputPartition):
    """One chunk of one snapshot: ``snapshot`` rows."""

    snapshot: ss.SnapshotRef
    chunk: Any


@dataclass(frozen=True)
class LogPartition(InputPartition):
    """A run of LSNs inside one segment: ``changes`` rows."""

    piece: LogSlice


@dataclass(frozen=True)
class StatePartition(InputPartition):
    """The keys in ``[lo, hi)`` (``None``: unbounded): the rows of one snapshot
    chunk (or none) with the log tail ``pieces`` applied."""

    snapshot: ss.SnapshotRef | None
    chunk: Any
    lo: bytes | None
    hi: bytes | None
    pieces: tuple[LogSlice, ...]


def _read_partition(files: StoreFiles, opts: Options, partition: Any) -> Iterator[Any]:
    kf, vf, rows = opts.key_format, opts.value_format, opts.rows_per_batch
    if isinstance(partition, LogPartition):
        piece = partition.piece
        yield from sa.change_batches(
            files.iter_entries(piece), _decode_batch, kf, vf, files.display(piece.path), rows
        )
    elif isinstance(partition, ChunkPartition):
        snap, chunk = partition.snapshot, partition.chunk
        for keys, values in ss.read_chunk(files, snap, chunk, rows):
            yield sa.snapshot_batch(
                sa.binary_array(keys), sa.binary_array(values), snap.lsn, kf, vf, lambda: ss.where(files, snap, chunk)
            )
    elif isinstance(partition, StatePartition):
        yield from _read_state_partition(files, opts, partition)
    elif partition is None or type(partition) is InputPartition:
        return  # Spark's placeholder when a plan has no partitions: no rows
    else:
        raise TypeError(f"not a walkv partition: {partition!r}")


def _read_state_partition(files: StoreFiles, opts: Options, p: StatePartition) -> Iterator[Any]:
    tail = sa.TailState(p.lo, p.hi)
    for piece in p.pieces:
        shown = files.display(piece.path)
        for entry in files.iter_entries(piece):
            tail.add(entry.lsn, _decode_batch(entry.payload, entry.lsn, shown), shown)
    kf, vf = opts.key_format, opts.value_format
    if p.snapshot is not None and p.chunk is not None:
        snap, chunk = p.snapshot, p.chunk

        def where() -> str:
            return ss.where(files, snap, chunk)

        for keys, values in ss.read_chunk(files, snap, chunk, opts.rows_per_batch):
            k, v = tail.filter_snapshot(sa.binary_array(keys), sa.binary_array(values))
            if len(k):
                yield sa.snapshot_batch(k, v, snap.lsn, kf, vf, where, sa.STATE)
    keys, values, lsns = tail.survivors()
    for i in range(0, len(keys), opts.rows_per_batch):
        j = i + opts.rows_per_batch
        yield sa.state_batch(keys[i:j], values[i:j], lsns[i:j], kf, vf, lambda: f"{files.location}, log tail")


# -- planning (on the driver) --------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one batch query reads, fixed once: the snapshot, the LSN range of
    the log (inclusive), and the durable LSN it was planned against."""

    snapshot: ss.SnapshotRef | None
    from_lsn: int
    to_lsn: int
    durable_lsn: int


def plan(files: StoreFiles, opts: Options) -> Plan:
    """Choose the snapshot and the LSN range for a batch read."""
    files.check_store()
    durable = files.durable_lsn()
    if opts.ending_lsn is not None and opts.ending_lsn > durable:
        raise ValueError(
            f"endingLsn {opts.ending_lsn} is past the durable LSN {durable} of {files.location}; "
            "entries past it may still be lost to a crash, so they are not read"
        )
    end = durable if opts.ending_lsn is None else opts.ending_lsn
    snap: ss.SnapshotRef | None = None
    needs_snapshot = opts.table != sa.CHANGES or opts.starting_lsn is None
    if needs_snapshot:
        snap = ss.choose(files, opts.snapshot_lsn, opts.ending_lsn if opts.table != sa.SNAPSHOT else None)
    if opts.table == sa.CHANGES and opts.starting_lsn is not None:
        first_held = _first_held(files, durable)
        if opts.starting_lsn == EARLIEST:
            start = first_held
        elif opts.starting_lsn == LATEST:
            start = durable + 1
        else:
            start = int(opts.starting_lsn)
    else:
        start = (snap.lsn if snap is not None else 0) + 1
    return Plan(snap, start, end, durable)


def _first_held(files: StoreFiles, durable: int) -> int:
    segs = files.segments(durable)
    return segs[0].first_lsn if segs else durable + 1


def partitions_for(files: StoreFiles, opts: Options, p: Plan) -> list[Any]:
    if opts.table == sa.SNAPSHOT:
        if p.snapshot is None:
            return []
        return [ChunkPartition(p.snapshot, c) for c in p.snapshot.chunks]
    pieces = files.plan_log(p.from_lsn, p.to_lsn, p.durable_lsn, opts.max_partition_bytes)
    if opts.table == sa.CHANGES:
        return [LogPartition(piece) for piece in pieces]
    # state: one task per snapshot chunk's key range, covering every key.
    if p.snapshot is None or not p.snapshot.chunks:
        return [StatePartition(p.snapshot, None, None, None, tuple(pieces))]
    chunks = p.snapshot.chunks
    out = []
    for i, chunk in enumerate(chunks):
        lo = None if i == 0 else chunk.first_key
        hi = chunks[i + 1].first_key if i + 1 < len(chunks) else None
        out.append(StatePartition(p.snapshot, chunk, lo, hi, tuple(pieces)))
    return out


# -- the data source -------------------------------------------------------------


class WalkvDataSource(DataSource):
    """``spark.read.format("walkv")`` / ``spark.readStream.format("walkv")``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _options(self, streaming: bool | None = False) -> Options:
        return parse(self.options, streaming=streaming)

    def schema(self) -> Any:
        opts = self._options(streaming=None)
        return spark_schema(opts.table, opts.key_format, opts.value_format)

    def reader(self, schema: Any) -> "WalkvReader":
        return WalkvReader(self._options())

    def streamReader(self, schema: Any) -> "WalkvStreamReader":
        return WalkvStreamReader(self._options(streaming=True))


class WalkvReader(DataSourceReader):
    """A batch read, planned when created (on the driver)."""

    def __init__(self, opts: Options) -> None:
        self.opts = Options(**{**opts.__dict__, "path": normalize_location(opts.path)})
        self.files = StoreFiles(self.opts.path)
        self.plan = plan(self.files, self.opts)
        self._partitions = partitions_for(self.files, self.opts, self.plan)

    def partitions(self) -> list[Any]:
        return list(self._partitions)

    def read(self, partition: Any) -> Iterator[Any]:
        return _read_partition(self.files, self.opts, partition)


def _offset(lsn: int, store_id: str | None) -> dict:
    return {"lsn": int(lsn), "store": store_id or ""}


class WalkvStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The ``changes`` of a store as a stream; offsets are LSNs.

    A micro-batch from offset ``{"lsn": a}`` to ``{"lsn": b}`` holds the rows
    of LSNs ``a+1 .. b``, in LSN order within each partition.
    """

    def __init__(self, opts: Options) -> None:
        self.opts = Options(**{**opts.__dict__, "path": normalize_location(opts.path)})
        self.files = StoreFiles(self.opts.path)
        self.files.check_store()
        self.store_id = self.files.store_id()
        self._available_now: int | None = None

    # -- offsets -------------------------------------------------------------

    def _check(self, offset: dict, what: str) -> int:
        if not isinstance(offset, dict) or "lsn" not in offset:
            raise ValueError(f"{what} offset {offset!r} is not a walkv offset ({{'lsn': n, 'store': id}})")
        store = offset.get("store") or ""
        if self.store_id is None:
            self.store_id = self.files.store_id()
        if store and self.store_id and store != self.store_id:
            raise ValueError(
                f"the stream's checkpoint belongs to walkv store {store}, but {self.files.location} is store "
                f"{self.store_id}; use a new checkpointLocation for this store"
            )
        return int(offset["lsn"])

    def initialOffset(self) -> dict:
        durable = self.files.durable_lsn()
        start = self.opts.starting_lsn if self.opts.starting_lsn is not None else EARLIEST
        if start == EARLIEST:
            lsn = _first_held(self.files, durable) - 1
        elif start == LATEST:
            lsn = durable
        else:
            lsn = int(start) - 1
            if lsn > durable:
                raise ValueError(
                    f"startingLsn {start} is past the end of the log of {self.files.location} (durable LSN "
                    f"{durable}); give at most {durable + 1}, or 'latest'"
                )
        if self.store_id is None:
            self.store_id = self.files.store_id()
        return _offset(lsn, self.store_id)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_batch:
            return ReadMaxRows(self.opts.max_records_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.files.durable_lsn()

    def _target(self) -> int:
        durable = self.files.durable_lsn()
        if self._available_now is not None:
            return min(durable, self._available_now)
        return durable

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._check(start, "start")
        target = self._target()
        if begin > self.files.durable_lsn():
            raise ValueError(
                f"the stream's checkpoint is at LSN {begin}, past the end of the log of {self.files.location} "
                f"(durable LSN {self.files.durable_lsn()}); the store was restored or replaced: use a new checkpointLocation"
            )
        end = max(begin, target)
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + max(1, int(limit.max_rows)))
        return _offset(end, self.store_id)

    def reportLatestOffset(self) -> dict:
        return _offset(self.files.durable_lsn(), self.store_id)

    def partitions(self, start: dict, end: dict) -> Sequence[Any]:
        a = self._check(start, "start")
        b = self._check(end, "end")
        if b <= a:
            return []
        pieces = self.files.plan_log(a + 1, b, b, self.opts.max_partition_bytes)
        return [LogPartition(piece) for piece in pieces]

    def read(self, partition: Any) -> Iterator[Any]:
        return _read_partition(self.files, self.opts, partition)

    def commit(self, end: dict) -> None:
        self._check(end, "committed")


# -- state, computed by Spark ----------------------------------------------------


def read_state(spark: Any, path: str, *, snapshot_lsn: int | None = None, ending_lsn: int | None = None,
               key_format: str = sa.BINARY, value_format: str = sa.BINARY) -> Any:
    """The store's contents as a DataFrame (key, value, lsn), computed by Spark
    from ``table=snapshot`` and ``table=changes``: the last put or delete of
    each key by (LSN, op index) wins, then a put is dropped when a later range
    delete covers it (a range join). Equal to ``table=state``; this form lets
    Spark shuffle, so it scales with the log tail too.

    The snapshot and the LSN range are fixed here, once, so both reads agree.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    register(spark)
    opts = parse({"path": path, "table": sa.STATE, **({"endingLsn": str(ending_lsn)} if ending_lsn is not None else {}),
                  **({"snapshotLsn": str(snapshot_lsn)} if snapshot_lsn is not None else {})})
    files = StoreFiles(normalize_location(opts.path))
    p = plan(files, opts)
    snap_lsn = p.snapshot.lsn if p.snapshot is not None else 0
    formats = {"keyFormat": key_format, "valueFormat": value_format}
    snap = (
        spark.read.format(NAME).options(**formats).option("table", "snapshot").option("snapshotLsn", snap_lsn)
        .load(files.location)
    )
    changes = (
        spark.read.format(NAME).options(**formats).option("table", "changes").option("startingLsn", p.from_lsn)
        .option("endingLsn", p.to_lsn).load(files.location)
    )
    writes = changes.where(F.col("_change_type") != sa.DELETE_RANGE).select(
        "key", "value", F.col("_commit_version").alias("lsn"), F.col("_op_index").alias("idx")
    )
    candidates = snap.select("key", "value", "lsn", F.lit(-1).alias("idx")).unionByName(writes)
    w = Window.partitionBy("key").orderBy(F.col("lsn").desc(), F.col("idx").desc())
    latest = (
        candidates.withColumn("_rank", F.row_number().over(w)).where("_rank = 1").where(F.col("value").isNotNull())
    )
    ranges = changes.where(F.col("_change_type") == sa.DELETE_RANGE).select(
        F.col("key").alias("r_start"), F.col("end_key").alias("r_end"),
        F.col("_commit_version").alias("r_lsn"), F.col("_op_index").alias("r_idx"),
    )
    covered = (
        (F.col("key") >= F.col("r_start")) & (F.col("key") < F.col("r_end"))
        & ((F.col("r_lsn") > F.col("lsn")) | ((F.col("r_lsn") == F.col("lsn")) & (F.col("r_idx") > F.col("idx"))))
    )
    live = latest.join(F.broadcast(ranges), covered, "left_anti")
    return live.select("key", "value", "lsn")
