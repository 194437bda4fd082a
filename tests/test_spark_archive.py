"""The walkv Spark source reading an archive (kvstore.archive): every table
and the stream give what the store gives, one partition per log object or
snapshot chunk; once against the real S3 server."""

from __future__ import annotations

import os
import uuid

import pytest

from kvstore.archive import Archiver, ArchiveReader
from tests.test_spark_helpers import CHANGE_COLS, as_bytes, build_store

pytestmark = pytest.mark.spark





def rows(df, cols):
    return sorted((tuple(as_bytes(r[c]) for c in cols) for r in df.collect()), key=repr)


def read(spark, table, location, **options):
    r = spark.read.format("walkv").option("table", table)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(location)


def test_archive_dir_reads_like_the_store(walkv_spark, tmp_path):
    spark = walkv_spark
    built = build_store(str(tmp_path / "store"), seed=7, n_batches=120, trim=False)
    archive = str(tmp_path / "archive")
    Archiver(built.path, archive).ship_once()
    reader = ArchiveReader(archive)
    assert reader.last_lsn == built.last_lsn
    n_objects = len(reader.segments())
    assert n_objects >= 2

    for table, cols in (("snapshot", ["key", "value", "lsn"]), ("state", ["key", "value", "lsn"]),
                        ("changes", CHANGE_COLS)):
        from_archive = read(spark, table, archive)
        assert rows(from_archive, cols) == rows(read(spark, table, built.path), cols), table
    st = read(spark, "state", archive).collect()
    assert {as_bytes(r.key): as_bytes(r.value) for r in st} == built.model

    # Every LSN the archive holds, one partition per log object.
    everything = read(spark, "changes", archive, startingLsn="earliest")
    assert everything.rdd.getNumPartitions() == n_objects
    assert rows(everything, CHANGE_COLS) == sorted(built.change_rows(1), key=repr)
    # Point in time, from the archive alone.
    end = built.last_lsn - 7
    old = read(spark, "state", archive, endingLsn=end).collect()
    assert {as_bytes(r.key): as_bytes(r.value) for r in old} == built.state_at(end)
    snap = read(spark, "snapshot", archive)
    assert snap.rdd.getNumPartitions() == len(reader.snapshots()[-1].chunks)

    # The stream, from the archive: every change once, in LSN order.
    q = (spark.readStream.format("walkv").option("startingLsn", 1).load(archive)
         .writeStream.format("memory").queryName("walkv_archive_stream").start())
    try:
        q.processAllAvailable()
        got = spark.table("walkv_archive_stream").collect()
    finally:
        q.stop()
    assert sorted((r._commit_version, r._op_index) for r in got) == [(r[4], r[5]) for r in built.change_rows(1)]


def test_archive_on_s3_reads_like_the_store(walkv_spark, s3server, tmp_path):
    spark = walkv_spark
    # The Python workers of the running session need the S3 client settings
    # the server needs (tests/s3server.py sets them in this process).
    for name in ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION", "AWS_EC2_METADATA_DISABLED"):
        spark.sparkContext.environment[name] = os.environ[name]
    built = build_store(str(tmp_path / "store"), seed=11, n_batches=80, trim=False)
    uri = s3server.uri(f"spark-{uuid.uuid4().hex[:8]}")
    Archiver(built.path, uri).ship_once()
    n_objects = len(ArchiveReader(uri).segments())

    st = read(spark, "state", uri).collect()
    assert {as_bytes(r.key): as_bytes(r.value) for r in st} == built.model
    changes = read(spark, "changes", uri, startingLsn="earliest")
    assert changes.rdd.getNumPartitions() == n_objects
    assert rows(changes, CHANGE_COLS) == sorted(built.change_rows(1), key=repr)
