"""walkv's Spark data source: read a store's snapshot, log and state in parallel.

PySpark 4 Python data source (``pyspark.sql.datasource``), registered under
the name ``walkv``. It reads the store's files directly (no LMDB, no running
database) through the read-only file seam (:mod:`wal.readfs`), so a store on
a local disk, HDFS or S3 is read as the cluster sees it::

    from kvstore.spark import register
    register(spark)
    spark.read.format("walkv").option("table", "snapshot").load(path)   # key, value, lsn
    spark.read.format("walkv").option("table", "changes").load(path)    # the log after the snapshot
    spark.read.format("walkv").option("table", "state").load(path)      # current contents
    spark.read.format("walkv").option("format", "debezium").load(path)  # changes as Debezium events
    spark.read.format("walkv").option("changeVocabulary", "delta").load(path)  # Delta's change types
    spark.readStream.format("walkv").load(path)                         # the log, as a stream
    df.write.format("walkv").mode("append").save(path)                  # one atomic batch

``path`` may also be an archive (:mod:`kvstore.spark.archive`). Filters are
pushed down where the session allows it (:mod:`kvstore.spark.pushdown`,
:mod:`kvstore.spark.compat`); the writer is :mod:`kvstore.spark.writer`.
Columns are described in :mod:`kvstore.spark.arrow`, options in
:mod:`kvstore.spark.options`, planning and partitions in
:mod:`kvstore.spark.partitions`, snapshot chunks decoded to Arrow in
:mod:`kvstore.spark.columnar`, the stream in :mod:`kvstore.spark.stream`, Debezium-shaped events
(``format=debezium``) in :mod:`kvstore.spark.debezium`, Delta's change types
(``changeVocabulary=delta``) in :mod:`kvstore.spark.delta_cdf`, both from
:mod:`kvstore.spark.images`.
:func:`read_state` computes the state with DataFrame operations (a window
over (lsn, op index) per key, and a range join for range deletes);
``table=state`` computes the same inside the scan.

pyspark is imported when this module is; ``import kvstore`` does not import
it. Install the extra: ``pip install 'walkv[spark]'``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader

from kvstore.spark import arrow as sa
from kvstore.spark import debezium, delta_cdf, images
from kvstore.spark.archive import open_files
from kvstore.spark.compat import enable_pushdown, pushdown_enabled
from kvstore.spark.files import normalize_location
from kvstore.spark.options import Options, parse
from kvstore.spark.partitions import partitions_for, plan, read_partition
from kvstore.spark.pushdown import COMMIT_VERSION, Bounds, pushed
from kvstore.spark.stream import WalkvStreamReader
from kvstore.spark.writer import WalkvWriter

__all__ = ["WalkvDataSource", "WalkvPushdownDataSource", "WalkvPushdownReader", "WalkvReader", "read_state", "register", "spark_schema"]

NAME = "walkv"


def register(spark: Any) -> None:
    """Register the ``walkv`` data source with a SparkSession.

    Filter pushdown (PySpark 4.1+) needs the session setting
    :data:`~kvstore.spark.compat.PUSHDOWN_CONF` on, and PySpark fails every
    query of a reader that takes filters while it is off; the class Spark
    uses is fixed here. So when the setting was left unset, this turns it on
    for the session and registers the source that takes filters; when it was
    set off, the one that does not (register again after changing it).
    Without filter pushdown (PySpark 4.0) the source reads as before, unpruned.

    The source also keeps the session's default parallelism: a ``changes``
    read is cut into at least that many pieces (``minPartitions``'s default)."""
    enable_pushdown(spark)
    base = WalkvPushdownDataSource if pushdown_enabled(spark) else WalkvDataSource
    # A class made here is pickled whole (not by name) to the Python workers, with the parallelism.
    spark.dataSource.register(type(base.__name__, (base,), {"parallelism": _parallelism(spark),
                                                            "__module__": __name__}))


def _parallelism(spark: Any) -> int:
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext: the setting, if any
        return max(1, int(spark.conf.get("spark.default.parallelism", "1") or 1))


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


class WalkvDataSource(DataSource):
    """``spark.read.format("walkv")`` / ``spark.readStream.format("walkv")``."""

    parallelism = 1  # the session's default parallelism, set by register()

    @classmethod
    def name(cls) -> str:
        return NAME

    def _options(self, streaming: bool | None = False) -> Options:
        return parse(self.options, streaming=streaming, parallelism=self.parallelism)

    def schema(self) -> Any:
        opts = self._options(streaming=None)
        if opts.debezium:
            from pyspark.sql.pandas.types import from_arrow_schema

            return from_arrow_schema(debezium.arrow_schema(opts.key_format, opts.value_format))
        return spark_schema(opts.table, opts.key_format, opts.value_format)

    def reader(self, schema: Any) -> WalkvReader:
        return WalkvReader(self._options())

    def writer(self, schema: Any, overwrite: bool) -> WalkvWriter:
        path = self.options.get("path")
        if not path:
            raise ValueError("give the store's path: df.write.format('walkv').save('/path/to/store')")
        return WalkvWriter(str(path), list(schema.fieldNames()), overwrite, self.options.get("txnAppId"),
                           self.options.get("txnVersion"))

    def streamReader(self, schema: Any) -> WalkvStreamReader:
        return WalkvStreamReader(self._options(streaming=True))


class WalkvPushdownDataSource(WalkvDataSource):
    """``walkv`` whose batch reader takes pushed-down filters (:mod:`kvstore.spark.pushdown`)."""

    def reader(self, schema: Any) -> WalkvReader:
        return WalkvPushdownReader(self._options())


class WalkvReader(DataSourceReader):
    """A batch read, planned when created (on the driver)."""

    def __init__(self, opts: Options) -> None:
        self.opts = replace(opts, path=normalize_location(opts.path))
        self.files = open_files(self.opts.path)
        self.plan = plan(self.files, self.opts)
        self.bounds = Bounds()

    def partitions(self) -> list[Any]:
        if self.opts.needs_images:
            return list(images.batch_partitions(self.files, self.opts))
        return partitions_for(self.files, self.opts, self.plan, self.bounds)

    def read(self, partition: Any) -> Iterator[Any]:
        if isinstance(partition, images.ImagePartition):
            return images.read(self.files, self.opts, partition,
                               debezium.Events if self.opts.debezium else delta_cdf.Rows)
        return read_partition(self.files, self.opts, partition)


class WalkvPushdownReader(WalkvReader):
    """A batch read that prunes by the filters Spark pushes, and takes those
    it applies exactly (``explain()`` shows them as ``PushedFilters``); the
    rest are handed back for Spark to evaluate (:mod:`kvstore.spark.pushdown`)."""

    def pushFilters(self, filters: list[Any]) -> Iterable[Any]:
        if self.opts.needs_images:
            return filters  # no pushdown: a key's previous value needs its whole range's history
        lsn_column = COMMIT_VERSION if self.opts.table == sa.CHANGES else None
        self.bounds, exact = pushed(filters, lsn_column)
        taken = {id(f) for f in exact}
        return [f for f in filters if id(f) not in taken]


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
    files = open_files(opts.path)
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
