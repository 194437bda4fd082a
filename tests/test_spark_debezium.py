"""``format=debezium``: the changes as Debezium-shaped events, every field
checked against a model (a literal one for a hand-written store, a replayed
one for random stores with snapshots in several chunks)."""

from __future__ import annotations

import pytest

import kvstore
from kvstore.spark.files import StoreFiles
from tests.test_spark_helpers import as_bytes, build_store, log_timestamps

pytestmark = pytest.mark.spark

SCHEMA = ("struct<key:binary,before:binary,after:binary,source:struct<store_id:string,lsn:bigint,ts_ms:bigint,"
          "op_index:int,snapshot:boolean,keyspace:string>,op:string,ts_ms:bigint>")




def rows(df):
    """(key, before, after, op, lsn, op_index, snapshot, source ts_ms, ts_ms, store_id), sorted by position."""
    out = [(as_bytes(r.key), as_bytes(r.before), as_bytes(r.after), r.op, r.source.lsn, r.source.op_index, r.source.snapshot,
            r.source.ts_ms, r.ts_ms, r.source.store_id) for r in df.collect()]
    return sorted(out, key=lambda x: (x[4], x[5], x[0]))


def read(spark, path, **options):
    reader = spark.read.format("walkv").option("format", "debezium")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(path)


def stamp(path):
    """LSN -> (source.ts_ms, ts_ms, store_id) as the rows must give them."""
    sid = StoreFiles(path).store_id()
    return {lsn: (us // 1000, us // 1000, sid) for lsn, us in log_timestamps(path).items()}


def hand_written_store(path):
    """Puts, overwrites, deletes (one of a missing key), a batch, a failed and
    a successful conditional write, range deletes, and a snapshot at LSN 9."""
    with kvstore.open(path) as db:
        assert db.put(b"a", b"1") == 1
        db.put(b"b", b"1")
        db.put(b"a", b"2")
        db.delete(b"b")
        db.delete(b"x")  # absent: no event
        with db.batch() as b:
            b.put(b"c", b"1")
            b.put(b"d", b"1")
            b.put(b"b", b"2")
        with db.transaction() as t:  # fails: logged [7, 0], no event
            t.require(b"a", absent=True)
            t.put(b"e", b"1")
        assert t.lsn == 7 and not t.succeeded
        assert db.delete_range(b"b", b"d") == 8
        with db.transaction() as t:
            t.require(b"a", equals=b"2")
            t.put(b"a", b"3")
        assert t.lsn == 9 and t.succeeded
        assert db.snapshot().lsn == 9
        db.put(b"d", b"2")
        db.delete_range(b"a", b"z")
        assert db.put(b"a", b"4") == 12


# (key, before, after, op, lsn, op_index) of every event of the hand-written store
HAND_EVENTS = [
    (b"a", None, b"1", "c", 1, 0),
    (b"b", None, b"1", "c", 2, 0),
    (b"a", b"1", b"2", "u", 3, 0),
    (b"b", b"1", None, "d", 4, 0),
    (b"c", None, b"1", "c", 6, 0),
    (b"d", None, b"1", "c", 6, 1),
    (b"b", None, b"2", "c", 6, 2),
    (b"b", b"2", None, "d", 8, 0),
    (b"c", b"1", None, "d", 8, 0),
    (b"a", b"2", b"3", "u", 9, 1),
    (b"d", b"1", b"2", "u", 10, 0),
    (b"a", b"3", None, "d", 11, 0),
    (b"d", b"2", None, "d", 11, 0),
    (b"a", None, b"4", "c", 12, 0),
]


def with_source(events, path):
    s = stamp(path)
    return [(k, bf, af, op, lsn, i, False, *s[lsn]) for k, bf, af, op, lsn, i in events]


def test_hand_written_store_from_lsn_1(walkv_spark, tmp_path):
    path = str(tmp_path / "store")
    hand_written_store(path)
    df = read(walkv_spark, path, startingLsn=1)
    assert df.schema.simpleString() == SCHEMA
    assert [f.nullable for f in df.schema.fields] == [False, True, True, False, False, False]
    assert [f.nullable for f in df.schema["source"].dataType.fields] == [True, False, False, False, False, False]
    assert rows(df) == with_source(HAND_EVENTS, path)
    # From LSN 5: the before values of LSNs 5.. come from the log before it (no snapshot at or before 4).
    assert rows(read(walkv_spark, path, startingLsn=5)) == with_source([e for e in HAND_EVENTS if e[4] >= 5], path)
    # String values, and an ending LSN.
    text = read(walkv_spark, path, startingLsn=2, endingLsn=4, valueFormat="string", keyFormat="string")
    assert [(r.key, r.before, r.after, r.op) for r in text.orderBy("source.lsn").collect()] == \
        [("b", None, "1", "c"), ("a", "1", "2", "u"), ("b", "1", None, "d")]


def test_hand_written_store_from_the_snapshot(walkv_spark, tmp_path):
    path = str(tmp_path / "store")
    hand_written_store(path)
    after = with_source([e for e in HAND_EVENTS if e[4] > 9], path)
    # Default: from the newest snapshot (LSN 9), whose contents give the before values.
    assert rows(read(walkv_spark, path)) == after
    # startingFrom=snapshot: the snapshot's rows first, as r events at its LSN and time.
    got = rows(read(walkv_spark, path, startingFrom="snapshot"))
    reads = [r for r in got if r[3] == "r"]
    sid = StoreFiles(path).store_id()
    assert [r[:7] for r in reads] == [(b"a", None, b"3", "r", 9, -1, True), (b"d", None, b"1", "r", 9, -1, True)]
    assert all(r[7] == r[8] and r[9] == sid for r in reads)
    assert [r for r in got if r[3] != "r"] == after


def model_events(built, start, end=None, snapshot_lsn=None):
    """The events of LSNs start..end replayed from the model (and the
    snapshot's rows as r events), without source times."""
    end = built.last_lsn if end is None else end
    out = []
    if snapshot_lsn is not None:
        out += [(k, None, v, "r", snapshot_lsn, -1, True) for k, v in sorted(built.snapshots[snapshot_lsn].items())]
    state: dict[bytes, bytes] = {}
    for lsn, ops in built.batches:
        if lsn > end:
            break
        emit = lsn >= start
        for i, op in enumerate(ops):
            if op[0] == 1:
                before = state.get(op[1])
                state[op[1]] = op[2]
                if emit:
                    out.append((op[1], before, op[2], "u" if before is not None else "c", lsn, i, False))
            elif op[0] == 2:
                if op[1] in state and emit:
                    out.append((op[1], state[op[1]], None, "d", lsn, i, False))
                state.pop(op[1], None)
            else:
                for k in sorted(k for k in state if op[1] <= k < op[2]):
                    if emit:
                        out.append((k, state[k], None, "d", lsn, i, False))
                    del state[k]
    return sorted(out, key=lambda x: (x[4], x[5], x[0]))


@pytest.mark.parametrize("seed", [3, 11])
def test_random_store_against_the_model(walkv_spark, tmp_path, seed):
    path = str(tmp_path / "store")
    built = build_store(path, seed, trim=False)
    s1, s2 = sorted(built.snapshots)
    ts = stamp(path)
    for lsn, _ in built.batches:
        assert ts[lsn][0] == ts[lsn][1]

    def check(df, expected):
        got = rows(df)
        assert [g[:7] for g in got] == expected
        assert all(g[7:] == ts[g[4]] for g in got if not g[6])

    check(read(walkv_spark, path, startingLsn=1), model_events(built, 1))
    # Between the snapshots: rebuilt from the first one (several chunks: several partitions) and the log after it.
    mid = s1 + 5
    check(read(walkv_spark, path, startingLsn=mid, endingLsn=s2 + 3), model_events(built, mid, s2 + 3))
    check(read(walkv_spark, path), model_events(built, s2 + 1))
    check(read(walkv_spark, path, startingFrom="snapshot"), model_events(built, s2 + 1, snapshot_lsn=s2))


def test_stream_of_events_in_capped_micro_batches(walkv_spark, tmp_path):
    path = str(tmp_path / "store")
    built = build_store(path, 5, trim=True)
    s2 = max(built.snapshots)
    got: list = []

    def collect(df, batch_id):
        got.extend(rows(df))

    q = (walkv_spark.readStream.format("walkv").option("format", "debezium").option("startingFrom", "snapshot")
         .option("maxRecordsPerTrigger", 9).load(path).writeStream.foreachBatch(collect)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= (built.last_lsn - s2) // 9  # each micro-batch rebuilt its before values
    assert sorted((g[:7] for g in got), key=lambda x: (x[4], x[5], x[0])) == \
        model_events(built, s2 + 1, snapshot_lsn=s2)


def test_format_option_is_checked():
    from kvstore.spark.options import parse

    assert parse({"path": "/x", "format": "Debezium", "startingFrom": "snapshot"}).debezium
    assert not parse({"path": "/x"}).debezium
    with pytest.raises(ValueError, match="format"):
        parse({"path": "/x", "format": "avro"})
    with pytest.raises(ValueError, match="table=changes"):
        parse({"path": "/x", "format": "debezium", "table": "state"})
    with pytest.raises(ValueError, match="for streams"):
        parse({"path": "/x", "startingFrom": "snapshot"})
