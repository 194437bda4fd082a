"""The rows ``walkv export --incremental --merge`` appends to ``OUT/state_merge/``: what a ``MERGE INTO`` takes.

Instead of rewriting ``state``, each run appends to ``OUT/state_merge/`` one
row per key whose value changed in the LSNs after the previous run's end LSN (the first
run: every key of the store), with its value at the export's end LSN and
``_deleted`` true (value null) for a key deleted since (a tombstone). ``lsn``
is the key's last change and ``_export_lsn`` the run's end LSN, so rows
appended by several runs are applied in ``lsn`` order (the newest row of a
key wins), or one run's alone::

    MERGE INTO t USING (SELECT * FROM m WHERE lsn > :last_merged) s
      ON t.keyspace = s.keyspace AND t.key = s.key
      WHEN MATCHED AND s._deleted THEN DELETE
      WHEN MATCHED THEN UPDATE SET value = s.value, lsn = s.lsn
      WHEN NOT MATCHED AND NOT s._deleted THEN INSERT (key, value, lsn, keyspace)
        VALUES (s.key, s.value, s.lsn, s.keyspace)

The changed keys come from ``changeVocabulary=delta`` (exact: a range delete
is a tombstone per key it deleted), so the log from the snapshot before the
previous end LSN must still be there, else the run fails with
:class:`~wal.errors.LogGapError`: export again into a new ``OUT``.

Columns: ``key``, ``value``, ``lsn``, ``keyspace`` (as ``state``'s),
``_deleted`` boolean and ``_export_lsn`` bigint.
"""

from __future__ import annotations

from typing import Any

from kvstore.spark.arrow import STATE

EXPORT_LSN = "_export_lsn"


def merge_rows(spark: Any, location: str, first: int | None, end: int, snap_lsn: int, fmt: dict[str, str]) -> Any:
    """The MERGE rows of the keys changed in LSNs ``first .. end`` (``first``
    None: every key at ``end``, from the snapshot at ``snap_lsn``), as a
    DataFrame read with the reader options ``fmt``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    reader = spark.read.format("walkv").options(**fmt)
    if first is None:
        state = reader.option("table", STATE).option("snapshotLsn", snap_lsn)
        if end >= snap_lsn:
            state = state.option("endingLsn", end)
        frame = state.load(location).select("key", "value", "lsn", "keyspace", F.lit(False).alias("_deleted"))
    else:
        changed = (reader.option("changeVocabulary", "delta").option("startingLsn", first)
                   .option("endingLsn", end).load(location).where(F.col("_change_type") != "update_preimage"))
        newest = Window.partitionBy("keyspace", "key").orderBy(F.col("_commit_version").desc(),
                                                               F.col("_op_index").desc())
        last = changed.withColumn("_rank", F.row_number().over(newest)).where("_rank = 1")
        deleted = F.col("_change_type") == "delete"
        frame = last.select("key", F.when(deleted, None).otherwise(F.col("value")).alias("value"),
                            F.col("_commit_version").alias("lsn"), "keyspace", deleted.alias("_deleted"))
    return frame.withColumn(EXPORT_LSN, F.lit(end))


__all__ = ["EXPORT_LSN", "merge_rows"]
