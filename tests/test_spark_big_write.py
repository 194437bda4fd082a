"""A Spark write larger than one log record (issue 38): refused with
RecordTooLargeError before, a staged group now. A job with ``txnAppId`` is
always a group, so 100,000 rows of 100-byte values (~11 MiB, three parts of
about 4 MiB) show it and the test stays quick; the true 800,000-row, 88 MiB
write is ``python -m benchmarks.spark_big_write``. The write is atomic (state equals
the DataFrame, ``changes`` shows every row at one LSN), and the same job
with the same ``txnAppId``/``txnVersion`` applies nothing the second time,
a higher version applies."""

from __future__ import annotations

import pytest

import kvstore

pytest.importorskip("pyspark")

ROWS = 100_000


def frame(spark, tag: str):
    from pyspark.sql import functions as F

    return spark.range(ROWS).select(
        F.format_string("k%07d", "id").alias("key"),
        F.concat(F.lit(tag), F.expr("repeat('v', 99)")).alias("value"))


@pytest.mark.spark
def test_a_write_over_one_record_commits_whole_once_per_version(walkv_spark, tmp_path):
    spark = walkv_spark
    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        db.put(b"base", b"1")
        before = db.last_lsn
    df = frame(spark, "a")
    df.repartition(2).write.format("walkv").mode("overwrite").option("txnAppId", "nightly") \
        .option("txnVersion", 7).save(path)
    with kvstore.open(path) as db:
        state = dict(db.scan())
        lsn = db.last_lsn
        assert db.committed_version("nightly") == 7
    assert len(state) == ROWS and b"base" not in state
    assert state[b"k0000042"] == b"a" + b"v" * 99
    assert lsn - before >= 4  # overwrite's clear, the parts, then the commit
    changes = spark.read.format("walkv").option("table", "changes").option("startingLsn", before + 1).load(path)
    got = changes.groupBy("_commit_version").count().collect()
    assert [(r["_commit_version"], r["count"]) for r in got] == [(lsn, ROWS + 1)]  # the clear, then every row
    assert changes.filter("_change_type = 'upsert'").select("key").distinct().count() == ROWS

    frame(spark, "b").repartition(2).write.format("walkv").mode("append").option("txnAppId", "nightly") \
        .option("txnVersion", 7).save(path)  # the retried job: nothing
    with kvstore.open(path) as db:
        assert db.last_lsn == lsn and db.get(b"k0000042") == b"a" + b"v" * 99

    frame(spark, "c").repartition(2).write.format("walkv").mode("append").option("txnAppId", "nightly") \
        .option("txnVersion", 8).save(path)
    with kvstore.open(path) as db:
        assert db.get(b"k0000042") == b"c" + b"v" * 99 and db.committed_version("nightly") == 8
