"""The stream's and the changes table's controls, with the names Kafka and
Delta users know: each test fails if its option were ignored (micro-batches
are counted through ``query.recentProgress`` and a foreachBatch sink)."""

from __future__ import annotations

import datetime

import pytest

import kvstore
from tests.test_spark_helpers import as_bytes, build_store, log_timestamps

pytestmark = pytest.mark.spark




def run_available_now(spark, path, checkpoint, on_batch=None, **options):
    """Run a stream with Trigger.AvailableNow to its end; return the
    foreachBatch batches ``[(batch id, [(lsn, op index), ...])]`` and the
    query's progress reports."""
    sink: list = []
    reader = spark.readStream.format("walkv")
    for k, v in options.items():
        reader = reader.option(k, v)

    def collect(df, batch_id):
        sink.append((batch_id, [(r._commit_version, r._op_index, as_bytes(r.key), as_bytes(r.value)) for r in df.collect()]))
        if on_batch is not None:
            on_batch(batch_id)

    q = (reader.load(path).writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert not q.isActive
    assert q.exception() is None, q.exception()
    return sink, [p for p in q.recentProgress if p["numInputRows"] > 0]


def store_of(path, n, value=b"v" * 10):
    with kvstore.open(path, segment_bytes=4096) as db:
        return [db.put(b"k%04d" % i, value) for i in range(n)]


def test_max_records_per_trigger_caps_every_micro_batch(walkv_spark, tmp_path):
    path = str(tmp_path / "store")
    lsns = store_of(path, 30)
    sink, progress = run_available_now(walkv_spark, path, str(tmp_path / "ck"), maxRecordsPerTrigger=7)
    assert [lsn for _, rows in sink for lsn, *_ in rows] == lsns
    assert [p["numInputRows"] for p in progress] == [7, 7, 7, 7, 2]


def test_max_bytes_per_trigger_caps_every_micro_batch(walkv_spark, tmp_path):
    path = str(tmp_path / "store")
    lsns = store_of(path, 30, value=b"x" * 1000)  # a payload is a little over 1000 bytes
    sink, progress = run_available_now(walkv_spark, path, str(tmp_path / "ck"), maxBytesPerTrigger="3k")
    assert [lsn for _, rows in sink for lsn, *_ in rows] == lsns
    sizes = [p["numInputRows"] for p in progress]
    assert max(sizes) <= 3 and len(sizes) >= 10
    # Both caps: the smaller wins in each micro-batch.
    _, progress = run_available_now(walkv_spark, path, str(tmp_path / "ck2"), maxBytesPerTrigger="10k",
                                    maxRecordsPerTrigger=4)
    assert [p["numInputRows"] for p in progress] == [4] * 7 + [2]


def test_available_now_ends_at_the_lsn_durable_when_it_started(walkv_spark, tmp_path):
    path = str(tmp_path / "store")
    lsns = store_of(path, 20)
    db = kvstore.open(path, segment_bytes=4096)
    try:
        # Each micro-batch writes more: an AvailableNow query must not read it, and it ends.
        sink, progress = run_available_now(walkv_spark, path, str(tmp_path / "ck"),
                                           on_batch=lambda _: [db.put(b"later", b"x") for _ in range(5)],
                                           maxRecordsPerTrigger=6)
        assert db.last_lsn == 20 + 5 * len(sink)
    finally:
        db.close()
    assert [lsn for _, rows in sink for lsn, *_ in rows] == lsns
    assert len(progress) == 4


def test_starting_and_ending_timestamps(walkv_spark, tmp_path):
    spark = walkv_spark
    path = str(tmp_path / "store")
    store_of(path, 40)
    stamps = log_timestamps(path)
    t_start, t_end = stamps[12], stamps[30]
    iso = datetime.datetime.fromtimestamp(t_start / 1e6, datetime.timezone.utc).isoformat()
    end_iso = datetime.datetime.fromtimestamp(t_end / 1e6, datetime.timezone.utc).isoformat()
    df = (spark.read.format("walkv").option("table", "changes").option("startingTimestamp", iso)
          .option("endingTimestamp", end_iso).load(path))
    got = sorted(r._commit_version for r in df.collect())
    assert got == [lsn for lsn in sorted(stamps) if t_start <= stamps[lsn] <= t_end]
    assert got[0] <= 12 and got[-1] >= 30
    # Epoch milliseconds (Kafka's form), on a stream.
    ms = t_start // 1000
    sink, _ = run_available_now(spark, path, str(tmp_path / "ck"), startingTimestamp=str(ms))
    first = min(lsn for _, rows in sink for lsn, *_ in rows)
    assert first == min(lsn for lsn in stamps if stamps[lsn] >= ms * 1000)
    # startingLsn / endingLsn on the batch table.
    df = (spark.read.format("walkv").option("table", "changes").option("startingLsn", 5)
          .option("endingLsn", 9).load(path))
    assert sorted(r._commit_version for r in df.collect()) == [5, 6, 7, 8, 9]
    # latest: a stream that starts at the end reads nothing of the past.
    sink, _ = run_available_now(spark, path, str(tmp_path / "ck-latest"), startingLsn="latest")
    assert [r for _, rows in sink for r in rows] == []


def test_fail_on_data_loss(walkv_spark, tmp_path, caplog):
    spark = walkv_spark
    built = build_store(str(tmp_path / "store"), seed=3, n_batches=100)
    assert built.first_lsn > 2
    read = spark.read.format("walkv").option("table", "changes").option("startingLsn", 1)
    with pytest.raises(Exception, match=rf"LogGapError.*LSNs 1\.\.{built.first_lsn - 1} are no longer"):
        read.load(built.path).collect()
    got = read.option("failOnDataLoss", "false").load(built.path).collect()
    assert min(r._commit_version for r in got) == built.first_lsn
    assert len(got) == len(built.change_rows(built.first_lsn))
    # The stream: fails by default, skips with a warning with failOnDataLoss=false.
    sink, _ = run_available_now(spark, built.path, str(tmp_path / "ck"), startingLsn=1, failOnDataLoss="false")
    assert sorted((lsn, i) for _, rows in sink for lsn, i, *_ in rows) == \
        [(r[4], r[5]) for r in built.change_rows(built.first_lsn)]
    q = (spark.readStream.format("walkv").option("startingLsn", 1).load(built.path).writeStream
         .format("memory").queryName("walkv_dataloss").start())
    with pytest.raises(Exception, match=rf"LSNs 1\.\.{built.first_lsn - 1} are no longer"):
        q.processAllAvailable()
    q.stop()


def test_starting_from_snapshot(walkv_spark, tmp_path):
    built = build_store(str(tmp_path / "store"), seed=5, n_batches=90)
    snap = max(built.snapshots)
    sink, _ = run_available_now(walkv_spark, built.path, str(tmp_path / "ck"), startingFrom="snapshot",
                                maxRecordsPerTrigger=4)
    first = sink[0][1]
    snap_rows = {k: v for lsn, i, k, v in first if i == -1}
    assert snap_rows == built.snapshots[snap]
    assert all(lsn == snap for lsn, i, *_ in first if i == -1)
    log_rows = sorted((lsn, i) for _, rows in sink for lsn, i, *_ in rows if i != -1)
    assert log_rows == [(r[4], r[5]) for r in built.change_rows(snap + 1)]
    assert len(sink) == 3  # the snapshot + LSNs 81..84, then 85..88, then 89..90: the cap applies to the log after the snapshot
