"""The walkv data source through a real local SparkSession (the session-scoped
``spark`` fixture): tables, the stream, the export job. Kept small: one
session, small stores, few queries."""

from __future__ import annotations

import json
import os
import threading

import pytest

import kvstore
import wal
from tests.test_spark_helpers import CHANGE_COLS, build_store, log_timestamps

pytestmark = pytest.mark.spark




def tuples(rows, cols):
    return [tuple(r[c] for c in cols) for r in rows]


def as_bytes(v):
    return bytes(v) if isinstance(v, (bytearray, memoryview)) else v


def change_tuples(rows):
    return [tuple(as_bytes(x) for x in t) for t in tuples(rows, CHANGE_COLS)]


def test_snapshot_changes_state_equal_the_store(walkv_spark, tmp_path):
    spark = walkv_spark
    from kvstore.spark import read_state

    built = build_store(str(tmp_path / "store"), seed=42, n_batches=150)
    snap = max(built.snapshots)
    read = spark.read.format("walkv")

    s = read.option("table", "snapshot").load(built.path)
    assert [f.name for f in s.schema] == ["key", "value", "lsn", "keyspace"]
    got = {as_bytes(r.key): (as_bytes(r.value), r.lsn) for r in s.collect()}
    assert got == {k: (v, snap) for k, v in built.snapshots[snap].items()}

    c = spark.read.format("walkv").option("table", "changes").load("file://" + built.path)
    assert c.rdd.getNumPartitions() >= 2
    rows = c.orderBy("_commit_version", "_op_index").collect()
    assert change_tuples(rows) == built.change_rows(snap + 1)
    stamps = log_timestamps(built.path)
    for r in rows:
        us = round(r._commit_timestamp.timestamp() * 1_000_000)
        assert abs(us - stamps[r._commit_version]) <= 1

    st = spark.read.format("walkv").option("table", "state").load(built.path).collect()
    assert {as_bytes(r.key): as_bytes(r.value) for r in st} == built.model
    by_frames = read_state(spark, built.path).collect()
    assert sorted(tuples(by_frames, ["key", "value", "lsn"])) == sorted(tuples(st, ["key", "value", "lsn"]))
    # Point in time: the state as of an LSN inside the retained log.
    end = built.last_lsn - 10
    old = spark.read.format("walkv").option("table", "state").option("endingLsn", end).load(built.path)
    assert {as_bytes(r.key): as_bytes(r.value) for r in old.collect()} == built.state_at(end)


def test_string_keys_and_values(walkv_spark, tmp_path):
    built = build_store(str(tmp_path / "store"), seed=9, n_batches=40, text=True, snapshot_after=(20,))
    df = (walkv_spark.read.format("walkv").option("table", "state").option("keyFormat", "string")
          .option("valueFormat", "string").load(built.path))
    assert [f.dataType.simpleString() for f in df.schema] == ["string", "string", "bigint", "string"]
    assert {r.key.encode(): r.value.encode() for r in df.collect()} == built.model
    # Spark compares the strings as UTF-8 bytes, so the range join agrees too.
    from kvstore.spark import read_state

    frames = read_state(walkv_spark, built.path, key_format="string", value_format="string")
    assert {r.key.encode(): r.value.encode() for r in frames.collect()} == built.model


def test_stream_memory_sink_every_change_once_in_lsn_order(walkv_spark, tmp_path):
    spark = walkv_spark
    path = str(tmp_path / "store")
    with kvstore.open(path, segment_bytes=4096) as db:
        expected = []

        def write(n: int) -> None:
            for i in range(n):
                with db.batch() as b:
                    b.put(b"k%04d" % i, b"v%d" % db.last_lsn)
                    b.delete(b"gone")
                expected.append(b.lsn)

        write(30)
        q = (spark.readStream.format("walkv").option("maxRecordsPerBatch", 25).load(path)
             .writeStream.format("memory").queryName("walkv_changes").start())
        try:
            q.processAllAvailable()
            got = spark.table("walkv_changes").collect()
            assert [r._commit_version for r in got] == [lsn for lsn in expected for _ in range(2)]
            assert [r._change_type for r in got[:2]] == ["upsert", "delete"]
            write(40)
            q.processAllAvailable()
            got = spark.table("walkv_changes").collect()
            assert [(r._commit_version, r._op_index) for r in got] == [(lsn, i) for lsn in expected for i in (0, 1)]
            # maxRecordsPerBatch: no micro-batch holds more than 25 log entries.
            for pr in q.recentProgress:
                for src in pr["sources"]:
                    a, b = json.loads(src["startOffset"] or "null"), json.loads(src["endOffset"] or "null")
                    if a and b:
                        assert 0 <= b["lsn"] - a["lsn"] <= 25
                        assert b["store"] == a["store"] and len(b["store"]) == 32
        finally:
            q.stop()


def _start(spark, path, checkpoint, sink, **options):
    reader = spark.readStream.format("walkv")
    for k, v in options.items():
        reader = reader.option(k, v)

    def collect(df, batch_id):
        sink.append((batch_id, [(r._commit_version, r._op_index) for r in df.collect()]))

    return reader.load(path).writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint).start()


def test_stream_restart_from_checkpoint_exactly_once(walkv_spark, tmp_path):
    spark = walkv_spark
    path = str(tmp_path / "store")
    checkpoint = str(tmp_path / "checkpoint")
    sink: list = []
    lsns = []

    def write(db, n):
        for i in range(n):
            lsns.append(db.put(b"k%03d" % (len(lsns) % 50), b"x" * 40))

    with kvstore.open(path, segment_bytes=4096) as db:
        write(db, 40)
        q = _start(spark, path, checkpoint, sink, startingLsn=1)
        try:
            q.processAllAvailable()
            write(db, 20)
            q.processAllAvailable()
        finally:
            q.stop()
        write(db, 25)  # written while no query runs
    q = _start(spark, path, checkpoint, sink, startingLsn=1)
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    got = [lsn for _, batch in sink for lsn, _ in batch]
    assert got == lsns == list(range(1, 86))
    ids = [bid for bid, _ in sink]
    assert ids == sorted(set(ids))

    # The same checkpoint against another store fails clearly.
    other = build_store(str(tmp_path / "other"), seed=1, n_batches=5, snapshot_after=())
    q = _start(spark, other.path, checkpoint, [])
    with pytest.raises(Exception, match="checkpoint belongs to walkv store"):
        q.processAllAvailable()
    q.stop()

    # Retention deleted segments the checkpoint still needs: the error names them.
    with kvstore.open(path, segment_bytes=4096) as db:
        write(db, 100)
    with wal.open(os.path.join(path, "wal"), segment_bytes=4096) as log:
        log.truncate_before(150)
        first = log.first_lsn
    assert first > 86
    q = _start(spark, path, checkpoint, [])
    with pytest.raises(Exception, match=rf"LSNs 86\.\.{first - 1} are no longer in the log"):
        q.processAllAvailable()
    q.stop()


def test_stream_reads_while_a_writer_commits(walkv_spark, tmp_path):
    """Concurrent group commits: the stream never sees a torn or non-durable entry."""
    spark = walkv_spark
    path = str(tmp_path / "store")
    sink: list = []
    with kvstore.open(path, segment_bytes=8192) as db:
        stop = threading.Event()

        def writer(t):
            i = 0
            while not stop.is_set() and i < 150:
                db.put(b"t%d-%04d" % (t, i), b"y" * 100)
                i += 1

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(3)]
        q = _start(spark, path, str(tmp_path / "ck"), sink)
        try:
            for t in threads:
                t.start()
            for _ in range(3):
                q.processAllAvailable()
            for t in threads:
                t.join()
            q.processAllAvailable()
        finally:
            stop.set()
            q.stop()
        last = db.last_lsn
    got = [lsn for _, batch in sink for lsn, _ in batch]
    assert got == list(range(1, last + 1))


def test_export_all_then_incremental(walkv_spark, tmp_path):
    from kvstore.spark.export import export

    spark = walkv_spark
    built = build_store(str(tmp_path / "store"), seed=5, n_batches=80, snapshot_after=(50,))
    out = str(tmp_path / "out")
    calls = []
    meta = export(built.path, out, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (3, 3)
    snap = max(built.snapshots)
    assert meta["snapshot_lsn"] == snap and meta["end_lsn"] == built.last_lsn
    st = spark.read.parquet(os.path.join(out, "state")).collect()
    assert {as_bytes(r.key): as_bytes(r.value) for r in st} == built.model
    sn = spark.read.parquet(os.path.join(out, "snapshot")).collect()
    assert {as_bytes(r.key): as_bytes(r.value) for r in sn} == built.snapshots[snap]
    ch = spark.read.parquet(os.path.join(out, "changes")).orderBy("_commit_version", "_op_index").collect()
    assert change_tuples(ch) == built.change_rows(snap + 1)
    assert meta["tables"]["changes"]["rows"] == len(ch)
    with open(os.path.join(out, "_walkv_export.json")) as f:
        assert json.load(f)["tables"]["state"]["rows"] == len(built.model)

    inc = str(tmp_path / "inc")
    m1 = export(built.path, inc, table="changes", incremental=True)
    assert m1["tables"]["changes"]["rows"] == len(built.change_rows(snap + 1))
    with kvstore.open(built.path, segment_bytes=4096) as db:
        new = [db.put(b"new%d" % i, b"v") for i in range(7)]
    m2 = export(built.path, inc, table="changes", incremental=True)
    assert m2["tables"]["changes"]["rows"] == 7
    assert m2["tables"]["changes"]["to_lsn"] == new[-1]
    ch = spark.read.parquet(os.path.join(inc, "changes")).orderBy("_commit_version", "_op_index").collect()
    assert [r._commit_version for r in ch] == [row[4] for row in built.change_rows(snap + 1)] + new


def test_snapshot_of_fixed_size_pairs_in_spark(walkv_spark, tmp_path):
    """The bulk Arrow reading of fixed-size keys and values (kvstore.spark.columnar)
    in Spark: the benchmark's count + sum(length(value)), projections of one
    column, and a damaged chunk failing the query with the file named."""
    from pyspark.sql import functions as F

    spark = walkv_spark
    path = str(tmp_path / "store")
    db = kvstore.open(path)
    items = {i.to_bytes(16, "big"): bytes([i % 256]) * 100 for i in range(30_000)}
    items[b"\xff" * 17] = b"x"  # a record of other sizes: read row by row
    db.update(items)
    db.snapshot()
    db.close()
    df = spark.read.format("walkv").option("table", "snapshot").load(path)
    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("b")).collect()[0]
    assert (row["n"], row["b"]) == (len(items), sum(map(len, items.values())))
    assert sorted(as_bytes(r["key"]) for r in df.select("key").collect()) == sorted(items)
    got = {as_bytes(r["key"]): as_bytes(r["value"]) for r in df.select("key", "value").collect()}
    assert got == items
    assert df.select("lsn").distinct().count() == 1
    snap_dir = os.path.join(path, "snapshots", sorted(os.listdir(os.path.join(path, "snapshots")))[-1])
    chunk = os.path.join(snap_dir, sorted(n for n in os.listdir(snap_dir) if n.endswith(".wkc"))[0])
    with open(chunk, "r+b") as f:
        f.seek(40_000)
        b = f.read(1)
        f.seek(40_000)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(Exception, match=r"checksum mismatch \(\S*chunk-000000\.wkc, offset [1-9]"):
        spark.read.format("walkv").option("table", "snapshot").load(path).agg(F.count(F.lit(1))).collect()
