"""The walkv Spark data source without Spark: options, schemas, planning,
partitions and read(), pickled as Spark ships them to executors."""

from __future__ import annotations

import os
import pickle

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

import kvstore  # noqa: E402
import wal  # noqa: E402
from kvstore.spark import arrow as sa  # noqa: E402
from kvstore.spark.files import StoreFiles  # noqa: E402
from kvstore.spark.options import parse  # noqa: E402
from kvstore.spark.partitions import ChunkPartition, LogPartition, StatePartition  # noqa: E402
from kvstore.spark.source import WalkvDataSource, WalkvReader, spark_schema  # noqa: E402
from kvstore.spark.stream import WalkvStreamReader  # noqa: E402
from tests.test_spark_helpers import CHANGE_COLS, build_store, log_timestamps  # noqa: E402
from wal.errors import CorruptionError, LogGapError  # noqa: E402


def ship(obj):
    """What Spark does to readers and partitions: pickle to another process."""
    return pickle.loads(pickle.dumps(obj))


def reader(path: str, **options: object) -> WalkvReader:
    return ship(WalkvReader(parse({"path": path, **{k: str(v) for k, v in options.items()}})))


def read_all(r, partitions=None) -> pa.Table | None:
    batches = []
    for p in partitions if partitions is not None else r.partitions():
        for b in r.read(ship(p)):
            assert isinstance(b, pa.RecordBatch)
            batches.append(b)
    return pa.Table.from_batches(batches) if batches else None


def rows(table, cols) -> list[tuple]:
    if table is None:
        return []
    d = table.to_pydict()
    return list(zip(*(d[c] for c in cols)))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("spark-unit") / "store")
    return build_store(path, seed=7, n_batches=150)


# -- options and schemas -------------------------------------------------------


def test_options_defaults_and_errors():
    o = parse({"path": "/x"})
    assert (o.table, o.key_format, o.value_format, o.starting_lsn, o.ending_lsn) == ("changes", "binary", "binary", None, None)
    o = parse({"PATH": "/x", "Table": "STATE", "keyformat": "utf8", "valueFormat": "string", "endingLsn": "9"})
    assert (o.table, o.key_format, o.value_format, o.ending_lsn) == ("state", "string", "string", 9)
    assert parse({"path": "/x", "startingLsn": "earliest"}).starting_lsn == "earliest"
    assert parse({"path": "/x", "startingLsn": "12"}).starting_lsn == 12
    bad = [
        ({"path": "/x", "table": "nope"}, "table"),
        ({"path": "/x", "startinglsn": "0"}, "startingLsn"),
        ({"path": "/x", "startingLsn": "soon"}, "startingLsn"),
        ({"path": "/x", "keyFormat": "latin1"}, "keyFormat"),
        ({"path": "/x", "startLsn": "3"}, "unknown option"),
        ({"path": "/x", "table": "state", "startingLsn": "3"}, "startingLsn"),
        ({"path": "/x", "table": "snapshot", "endingLsn": "3"}, "endingLsn"),
        ({"path": "/x", "startingLsn": "10", "endingLsn": "3"}, "before"),
        ({"path": "/x", "maxRecordsPerBatch": "3"}, "streams"),
        ({}, "path"),
    ]
    for options, words in bad:
        with pytest.raises(ValueError, match=words):
            parse(options)
    with pytest.raises(ValueError, match="table=changes only"):
        parse({"path": "/x", "table": "state"}, streaming=True)
    with pytest.raises(ValueError, match="maxRecordsPerTrigger"):
        parse({"path": "/x", "maxRecordsPerBatch": "0"}, streaming=True)
    # Spark asks for the schema without saying whether the read is a stream.
    assert parse({"path": "/x", "maxRecordsPerBatch": "5"}, streaming=None).max_records_per_batch == 5


@pytest.mark.parametrize("table", sa.TABLES)
@pytest.mark.parametrize("kf,vf", [("binary", "binary"), ("string", "binary"), ("binary", "string")])
def test_arrow_schema_is_what_spark_expects(table, kf, vf):
    from pyspark.sql.pandas.types import to_arrow_schema

    expected = to_arrow_schema(spark_schema(table, kf, vf), timezone="UTC")
    assert sa.arrow_schema(table, kf, vf).equals(expected)
    ds = WalkvDataSource({"path": "/x", "table": table, "keyFormat": kf, "valueFormat": vf})
    assert ds.schema() == spark_schema(table, kf, vf)
    assert WalkvDataSource.name() == "walkv"


# -- changes -----------------------------------------------------------------------




def test_changes_after_newest_snapshot(store):
    r = reader(store.path, table="changes")
    snap = max(store.snapshots)
    assert r.plan.snapshot.lsn == snap
    assert (r.plan.from_lsn, r.plan.to_lsn) == (snap + 1, store.last_lsn)
    parts = r.partitions()
    assert parts and all(isinstance(p, LogPartition) for p in parts)
    t = read_all(r, parts)
    assert t.schema.equals(sa.arrow_schema("changes"))
    assert rows(t, CHANGE_COLS) == store.change_rows(snap + 1)
    stamps = log_timestamps(store.path)
    got = rows(t, ["_commit_version", "_commit_timestamp"])
    for lsn, ts in got:
        us = int(ts.timestamp() * 1_000_000)
        assert abs(us - stamps[lsn]) <= 1 and ts.tzinfo is not None


def test_changes_between_lsns_and_earliest(store):
    a, b = store.first_lsn + 3, store.last_lsn - 5
    t = read_all(reader(store.path, startingLsn=a, endingLsn=b))
    assert rows(t, CHANGE_COLS) == store.change_rows(a, b)
    t = read_all(reader(store.path, startingLsn="earliest"))
    assert rows(t, CHANGE_COLS) == store.change_rows(store.first_lsn)
    assert read_all(reader(store.path, startingLsn="latest")) is None


def test_changes_gone_to_retention_name_the_lsns(store):
    assert store.first_lsn > 1  # the builder trimmed the log
    with pytest.raises(LogGapError, match=f"LSNs 1\\.\\.{store.first_lsn - 1} are no longer in the log") as e:
        reader(store.path, startingLsn=1).partitions()  # planned by partitions()
    assert (e.value.first_missing, e.value.last_missing) == (1, store.first_lsn - 1)
    with pytest.raises(ValueError, match="past the durable LSN"):
        reader(store.path, endingLsn=store.last_lsn + 1)


def test_every_lsn_in_exactly_one_partition_and_large_segments_split(tmp_path):
    built = build_store(str(tmp_path / "s"), seed=3, n_batches=1000, segment_bytes=32 << 10,
                        snapshot_after=(), keyspace=500, sync="none")
    whole = reader(built.path, startingLsn=1)
    split = reader(built.path, startingLsn=1, maxPartitionBytes=8192)
    assert len(split.partitions()) > 2 * len(whole.partitions())
    for r in (whole, split):
        pieces = [p.piece for p in r.partitions()]
        assert pieces[0].from_lsn == 1 and pieces[-1].to_lsn == built.last_lsn
        for x, y in zip(pieces, pieces[1:]):
            assert y.from_lsn == x.to_lsn + 1
        got = []
        for p in r.partitions():
            lsns = rows(read_all(r, [p]), ["_commit_version"])
            assert {x[0] for x in lsns} == set(range(p.piece.from_lsn, p.piece.to_lsn + 1))
            got.extend(lsns)
        assert [g[0] for g in got] == [row[4] for row in built.change_rows()]
    # A split inside the range starts at an index point at or before it.
    mid = reader(built.path, startingLsn=built.last_lsn // 2, maxPartitionBytes=8192)
    assert rows(read_all(mid), CHANGE_COLS) == built.change_rows(built.last_lsn // 2)


def test_end_lsn_never_past_durable(tmp_path):
    path = str(tmp_path / "s")
    with kvstore.open(path) as db:
        for i in range(5):
            db.put(b"k%d" % i, b"v")
    from kvstore.entry.codec import encode

    log = wal.open(os.path.join(path, "wal"), sync="none")
    try:
        for i in range(5):
            log.append(encode([[1, b"late%d" % i, b"x"]]))
        assert log.last_lsn == 10 and wal.read_durable_lsn(log.directory) == 5
        r = reader(path)
        assert r.plan.to_lsn == 5
        assert [x[0] for x in rows(read_all(r), ["_commit_version"])] == [1, 2, 3, 4, 5]
        log.sync()
        assert reader(path).plan.to_lsn == 10
        # The plan is fixed when the reader is made: a shipped reader does not move.
        assert r.plan.to_lsn == 5 and ship(r).plan.to_lsn == 5
    finally:
        log.close()


# -- snapshot and state ------------------------------------------------------------


def test_snapshot_one_partition_per_chunk(store):
    snap = max(store.snapshots)
    r = reader(store.path, table="snapshot")
    parts = r.partitions()
    assert len(parts) > 1 and all(isinstance(p, ChunkPartition) for p in parts)
    assert len(parts) == len(r.plan.snapshot.chunks)
    t = read_all(r, parts)
    assert t.schema.equals(sa.arrow_schema("snapshot"))
    assert rows(t, ["key", "value", "lsn"]) == [(k, v, snap) for k, v in sorted(store.snapshots[snap].items())]
    older = min(store.snapshots)
    t = read_all(reader(store.path, table="snapshot", snapshotLsn=older))
    assert dict(rows(t, ["key", "value"])) == store.snapshots[older]
    with pytest.raises(ValueError, match="no usable snapshot at LSN 5"):
        reader(store.path, table="snapshot", snapshotLsn=5)


def test_state_partitions_merge_to_the_store(store):
    r = reader(store.path, table="state")
    parts = r.partitions()
    assert all(isinstance(p, StatePartition) for p in parts) and len(parts) > 1
    t = read_all(r, parts)
    assert t.schema.equals(sa.arrow_schema("state"))
    got = rows(t, ["key", "value", "lsn"])
    assert len({k for k, _, _ in got}) == len(got)
    assert {k: v for k, v, _ in got} == store.model
    # lsn: the last write of the key (the snapshot's LSN when the tail left it alone).
    snap = max(store.snapshots)
    last_write = {}
    for lsn, ops in store.batches:
        for op in ops:
            if op[0] == 1:
                last_write[op[1]] = lsn
    for k, _, lsn in got:
        assert lsn == (last_write[k] if last_write.get(k, 0) > snap else snap)


def test_state_at_an_older_lsn(store):
    older, newer = min(store.snapshots), max(store.snapshots)
    for end in (older, newer, newer + 2, store.last_lsn - 1):
        r = reader(store.path, table="state", endingLsn=end)
        assert r.plan.snapshot.lsn == max(s for s in store.snapshots if s <= end)
        assert dict(rows(read_all(r), ["key", "value"])) == store.state_at(end)
    # Between the snapshots the log was trimmed: that state is gone, and said so.
    assert store.first_lsn > older + 1
    with pytest.raises(LogGapError, match=rf"LSNs {older + 1}\.\."):
        reader(store.path, table="state", endingLsn=older + 1).partitions()  # planned by partitions()


def test_store_without_snapshot(tmp_path):
    built = build_store(str(tmp_path / "s"), seed=11, n_batches=60, snapshot_after=())
    assert read_all(reader(built.path, table="snapshot")) is None
    assert reader(built.path, table="snapshot").partitions() == []
    assert dict(rows(read_all(reader(built.path, table="state")), ["key", "value"])) == built.model
    assert rows(read_all(reader(built.path)), CHANGE_COLS) == built.change_rows()


def test_uri_and_relative_paths_read_the_same(store, monkeypatch):
    by_path = rows(read_all(reader(store.path, table="state")), ["key", "value", "lsn"])
    by_uri = reader("file://" + store.path, table="state")
    assert by_uri.files.location == "file://" + store.path
    assert rows(read_all(by_uri), ["key", "value", "lsn"]) == by_path
    monkeypatch.chdir(os.path.dirname(store.path))
    rel = reader(os.path.basename(store.path), table="state")
    assert rel.files.location == store.path
    with pytest.raises(ValueError, match="not a walkv store"):
        reader(os.path.dirname(store.path))


def test_string_format(tmp_path):
    built = build_store(str(tmp_path / "s"), seed=5, n_batches=50, text=True)
    t = read_all(reader(built.path, table="state", keyFormat="string", valueFormat="string"))
    assert t.schema.equals(sa.arrow_schema("state", "string", "string"))
    assert {k.encode(): v.encode() for k, v in rows(t, ["key", "value"])} == built.model
    t = read_all(reader(built.path, keyFormat="string"))
    assert t.schema.field("key").type == pa.string() and t.schema.field("value").type == pa.binary()
    with kvstore.open(built.path) as db:
        db.put(b"\xff\xfe", b"x")
    with pytest.raises(ValueError, match="not valid UTF-8.*keyFormat=binary"):
        read_all(reader(built.path, keyFormat="string"))


def test_missing_segment_fails_with_the_lsns(tmp_path):
    built = build_store(str(tmp_path / "s"), seed=2, n_batches=80, snapshot_after=(), trim=False)
    r = reader(built.path, startingLsn=1)
    parts = r.partitions()
    victim = parts[1].piece
    os.unlink(victim.path)  # retention (or a person) removed it after planning
    with pytest.raises(LogGapError, match=f"LSNs {victim.from_lsn}\\.\\.{victim.to_lsn}"):
        read_all(r, [parts[1]])
    # A sealed segment cut short is corruption, not a shorter result.
    first = parts[0].piece
    os.truncate(first.path, os.path.getsize(first.path) // 2)
    with pytest.raises(CorruptionError, match=f"holds LSNs up to {first.to_lsn}"):
        read_all(r, [parts[0]])


# -- the stream reader ----------------------------------------------------------------


def test_stream_reader_offsets(store, tmp_path):
    opts = parse({"path": store.path, "maxRecordsPerBatch": "10"}, streaming=True)
    sr = ship(WalkvStreamReader(opts))
    start = sr.initialOffset()
    sid = StoreFiles(store.path).store_id()
    assert start == {"lsn": store.first_lsn - 1, "store": sid, "timelines": [[1, 1, 0]]}  # timeline 1
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    assert sr.getDefaultReadLimit() == ReadMaxRows(10)
    end = sr.latestOffset(start, sr.getDefaultReadLimit())
    assert end == {"lsn": store.first_lsn + 9, "store": sid, "timelines": [[1, 1, 0]]}
    assert sr.latestOffset(start, ReadAllAvailable())["lsn"] == store.last_lsn
    got = []
    cur = start
    while True:
        nxt = sr.latestOffset(cur, ReadMaxRows(25))
        if nxt == cur:
            break
        for p in sr.partitions(cur, nxt):
            got.extend(rows(read_all(sr, [p]), CHANGE_COLS))
        cur = nxt
    assert got == store.change_rows(store.first_lsn)
    assert sr.partitions(cur, cur) == []
    latest = ship(WalkvStreamReader(parse({"path": store.path, "startingLsn": "latest"}, streaming=True)))
    assert latest.initialOffset()["lsn"] == store.last_lsn
    future = WalkvStreamReader(parse({"path": store.path, "startingLsn": str(store.last_lsn + 2)}, streaming=True))
    with pytest.raises(ValueError, match="past the end of the log"):
        future.initialOffset()
    # A checkpoint from another store is refused.
    other = build_store(str(tmp_path / "other"), seed=1, n_batches=5, snapshot_after=())
    osr = WalkvStreamReader(parse({"path": other.path}, streaming=True))
    with pytest.raises(ValueError, match="checkpoint belongs to walkv store"):
        osr.latestOffset(start, ReadAllAvailable())
    # LSNs retention deleted are named.
    with pytest.raises(LogGapError, match="LSNs 1\\.\\."):
        sr.partitions({"lsn": 0, "store": sid}, {"lsn": store.first_lsn + 2, "store": sid})


def test_stream_available_now_stops_at_the_durable_lsn_it_saw(tmp_path):
    path = str(tmp_path / "s")
    with kvstore.open(path) as db:
        for i in range(10):
            db.put(b"k%d" % i, b"v")
        sr = WalkvStreamReader(parse({"path": path}, streaming=True))
        from pyspark.sql.streaming.datasource import ReadAllAvailable

        start = sr.initialOffset()
        sr.prepareForTriggerAvailableNow()
        for i in range(5):
            db.put(b"late%d" % i, b"v")
        assert sr.latestOffset(start, ReadAllAvailable())["lsn"] == 10
        assert WalkvStreamReader(parse({"path": path}, streaming=True)).latestOffset(start, ReadAllAvailable())["lsn"] == 15


def test_reads_files_only_no_lmdb(store, tmp_path):
    """Executors need the log and snapshot files only: a copy without lmdb/
    (and without write permission anywhere) reads the same."""
    import shutil
    import stat

    copy = str(tmp_path / "copy")
    shutil.copytree(store.path, copy, ignore=shutil.ignore_patterns("lmdb", "LOCK"))
    assert not os.path.exists(os.path.join(copy, "lmdb"))
    for root, dirs, names in os.walk(copy):
        for n in names:
            os.chmod(os.path.join(root, n), stat.S_IRUSR)
    try:
        for table in ("snapshot", "changes", "state"):
            a = rows(read_all(reader(store.path, table=table)), ["key", "value"])
            b = rows(read_all(reader(copy, table=table)), ["key", "value"])
            assert a == b
    finally:
        for root, dirs, names in os.walk(copy):
            for n in names:
                os.chmod(os.path.join(root, n), stat.S_IRUSR | stat.S_IWUSR)


@pytest.mark.parametrize("seed", range(6))
def test_random_stores_state_and_changes(tmp_path, seed):
    """Random stores (puts, deletes, range deletes, snapshots midway, small
    segments trimmed): state at several LSNs and the changes equal the model."""
    import random

    rng = random.Random(seed)
    n = rng.randint(30, 120)
    snaps = tuple(sorted(rng.sample(range(1, n), rng.randint(0, 3))))
    built = build_store(str(tmp_path / "s"), seed=seed, n_batches=n, snapshot_after=snaps,
                        trim=rng.random() < 0.7, keyspace=rng.choice([10, 40, 200]), sync="none",
                        segment_bytes=rng.choice([1024, 4096]))
    newest = max(built.snapshots, default=0)
    ends = {built.last_lsn, max(newest, built.first_lsn - 1, rng.randint(newest, built.last_lsn))}
    for end in sorted(ends):
        r = reader(built.path, table="state", endingLsn=end)
        got = rows(read_all(r), ["key", "value"])
        assert len(got) == len(dict(got)) and dict(got) == built.state_at(end), (seed, end)
    assert rows(read_all(reader(built.path)), CHANGE_COLS) == built.change_rows(newest + 1)
    if built.snapshots:
        t = read_all(reader(built.path, table="snapshot"))
        assert dict(rows(t, ["key", "value"])) == built.snapshots[newest]


def test_empty_snapshot(tmp_path):
    path = str(tmp_path / "s")
    with kvstore.open(path, segment_bytes=4096) as db:
        db.put(b"a", b"1")
        db.delete_range(None, None)
        info = db.snapshot()
        db.put(b"b", b"2")
        db.delete(b"b")
        db.put(b"c", b"3")
    r = reader(path, table="snapshot")
    assert r.plan.snapshot.lsn == info.lsn and r.plan.snapshot.chunks == () and r.partitions() == []
    from pyspark.sql.datasource import InputPartition

    assert list(r.read(ship(InputPartition(None)))) == []  # Spark's placeholder for "no partitions"
    assert rows(read_all(reader(path, table="state")), ["key", "value", "lsn"]) == [(b"c", b"3", info.lsn + 3)]
    assert [x[3] for x in rows(read_all(reader(path)), CHANGE_COLS)] == ["upsert", "delete", "upsert"]


def test_stream_control_options_parse():
    o = parse({"path": "/x", "maxBytesPerTrigger": "64m", "failOnDataLoss": "FALSE", "startingFrom": "snapshot",
               "maxRecordsPerTrigger": "9"}, streaming=True)
    assert (o.max_bytes_per_trigger, o.fail_on_data_loss, o.starting_from_snapshot, o.max_records_per_batch) == \
        (64 << 20, False, True, 9)
    assert parse({"path": "/x", "startingTimestamp": "1000"}).starting_timestamp_us == 1_000_000
    assert parse({"path": "/x", "startingTimestamp": "1970-01-01T00:00:01Z"}).starting_timestamp_us == 1_000_000
    for bad, word in (({"maxBytesPerTrigger": "lots"}, "maxBytesPerTrigger"),
                      ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
                      ({"startingFrom": "middle"}, "startingFrom"),
                      ({"startingTimestamp": "yesterday"}, "startingTimestamp"),
                      ({"startingLsn": "3", "startingTimestamp": "1"}, "not both"),
                      ({"startingFrom": "snapshot", "startingLsn": "3"}, "startingFrom")):
        with pytest.raises(ValueError, match=word):
            parse({"path": "/x", **bad}, streaming=True)
    with pytest.raises(ValueError, match="for streams"):
        parse({"path": "/x", "maxBytesPerTrigger": "1k"})


def test_pushdown_bounds_from_filters():
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        In,
        LessThanOrEqual,
        StringEndsWith,
        StringStartsWith,
    )

    from kvstore.spark.pushdown import prefix_end, pushed

    def bounds_of(filters, lsn_column):
        return pushed(filters, lsn_column)[0]

    assert prefix_end(b"ab") == b"ac" and prefix_end(b"a\xff") == b"b" and prefix_end(b"\xff") is None
    b = bounds_of([GreaterThan(("key",), b"b"), LessThanOrEqual(("key",), "d"), StringEndsWith(("key",), "x"),
                   GreaterThan(("_commit_version",), 10), LessThanOrEqual(("_commit_version",), 20)],
                  ("_commit_version",))
    assert (b.lo, b.hi, b.keys, b.min_lsn, b.max_lsn) == (b"b\x00", b"d\x00", None, 11, 20)
    assert b.lsn_range(1, 100) == (11, 20) and not b.empty
    assert bounds_of([StringStartsWith(("key",), "k01")], None).hi == b"k02"
    b = bounds_of([In(("key",), ("a", "q")), EqualTo(("key",), "q")], None)
    assert b.keys == {b"q"}
    assert bounds_of([EqualTo(("key",), "a"), GreaterThan(("key",), "b")], None).empty
    # _commit_version is ignored where it is not the LSN column (state, snapshot).
    assert bounds_of([EqualTo(("_commit_version",), 5)], None).min_lsn is None
    # Taken (applied exactly): keys where there is a key index, LSN comparisons but IN, keyspaces.
    key, lsn_in, lsn_gt, ks = (EqualTo(("key",), "a"), In(("_commit_version",), (3, 7)),
                               GreaterThan(("_commit_version",), 2), EqualTo(("keyspace",), "users"))
    ends = StringEndsWith(("key",), "x")
    assert pushed([key, lsn_in, lsn_gt, ks, ends], ("_commit_version",))[1] == [lsn_gt, ks]
    assert pushed([key, ks, ends], None)[1] == [key, ks]
