"""``changeVocabulary=delta``: the ``changes`` table in Delta Lake's change
types, checked row by row against a model: a literal one for a hand-written
store, and a Python model of random stores (conditional writes that fail,
snapshots in several chunks) for batch reads on both sides of a snapshot
and for a stream in capped micro-batches."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field

import pytest

import kvstore
from tests.test_spark_debezium import hand_written_store
from tests.test_spark_helpers import apply, as_bytes, log_timestamps, random_ops, take_snapshot, write_ops

pytestmark = pytest.mark.spark

SCHEMA = ("struct<key:binary,value:binary,end_key:binary,_change_type:string,_commit_version:bigint,"
          "_commit_timestamp:timestamp,_op_index:int,keyspace:string>")
INSERT, PRE, POST, DELETE = "insert", "update_preimage", "update_postimage", "delete"


def read(spark, path, **options):
    return spark.read.format("walkv").options(changeVocabulary="delta", **options).load(path)


def rows_of(df):
    """(key, value, type, lsn, op_index) of a DataFrame's rows, in the order
    Spark gave them; each task's rows checked to be in order, (LSN, op index,
    key), a pre-image before its post-image, and each key in one task."""
    from pyspark.sql.functions import spark_partition_id

    out, task_of = [], {}
    tasks = defaultdict(list)
    for r in df.withColumn("_task", spark_partition_id()).collect():
        assert r.end_key is None
        row = (as_bytes(r.key), as_bytes(r.value), r._change_type, r._commit_version, r._op_index)
        assert task_of.setdefault(row[0], r._task) == r._task
        tasks[r._task].append(row)
        out.append(row)
    for rows in tasks.values():
        assert rows == sorted(rows, key=_position)
    return out


def check(got, expected):
    """Every row exactly once, each key's rows in the model's order."""
    assert sorted(got, key=_position) == sorted(expected, key=_position)
    assert _by_key(got) == _by_key(expected)


def _by_key(rows):
    keyed = defaultdict(list)
    for r in rows:
        keyed[r[0]].append(r)
    return dict(keyed)


def _position(row):
    return row[3], row[4], row[0], row[2] != PRE


# -- a hand-written store: the rows written out ---------------------------------

# (key, value, type, lsn, op_index) of hand_written_store (tests/test_spark_debezium.py): LSN 5 deletes
# an absent key, LSN 7 is a conditional write that failed, LSN 8 and 11 are range deletes, a snapshot at 9.
HAND_ROWS = [
    (b"a", b"1", INSERT, 1, 0),
    (b"b", b"1", INSERT, 2, 0),
    (b"a", b"1", PRE, 3, 0),
    (b"a", b"2", POST, 3, 0),
    (b"b", b"1", DELETE, 4, 0),
    (b"c", b"1", INSERT, 6, 0),
    (b"d", b"1", INSERT, 6, 1),
    (b"b", b"2", INSERT, 6, 2),
    (b"b", b"2", DELETE, 8, 0),
    (b"c", b"1", DELETE, 8, 0),
    (b"a", b"2", PRE, 9, 1),
    (b"a", b"3", POST, 9, 1),
    (b"d", b"1", PRE, 10, 0),
    (b"d", b"2", POST, 10, 0),
    (b"a", b"3", DELETE, 11, 0),
    (b"d", b"2", DELETE, 11, 0),
    (b"a", b"4", INSERT, 12, 0),
]


def test_hand_written_store(walkv_spark, tmp_path):
    path = str(tmp_path / "store")
    hand_written_store(path)
    df = read(walkv_spark, path, startingLsn=1)
    assert df.schema.simpleString() == SCHEMA
    assert rows_of(df) == HAND_ROWS  # no snapshot before LSN 1: one task, in LSN order
    collected = df.collect()
    stamps = log_timestamps(path)
    assert all(int(r._commit_timestamp.timestamp()) * 1_000_000 + r._commit_timestamp.microsecond
               == stamps[r._commit_version] for r in collected)
    # From LSN 5 (rebuilt from the log before it), from the snapshot (the default) and with its rows.
    check(rows_of(read(walkv_spark, path, startingLsn=5)), [r for r in HAND_ROWS if r[3] >= 5])
    check(rows_of(read(walkv_spark, path)), [r for r in HAND_ROWS if r[3] > 9])
    check(rows_of(read(walkv_spark, path, startingFrom="snapshot")),
          [(b"a", b"3", INSERT, 9, -1), (b"d", b"1", INSERT, 9, -1)] + [r for r in HAND_ROWS if r[3] > 9])
    text = read(walkv_spark, path, startingLsn=3, endingLsn=4, keyFormat="string", valueFormat="string")
    assert [(r.key, r.value, r._change_type) for r in text.collect()] == \
        [("a", "1", PRE), ("a", "2", POST), ("b", "1", DELETE)]


# -- random stores against a Python model ------------------------------------------


@dataclass
class Logged:
    lsn: int
    writes: list[list]  # the batch's puts, deletes and range deletes
    first_index: int  # the op index of writes[0] (conditions come first)
    applied: bool  # False: a conditional write whose conditions failed


@dataclass
class Store:
    path: str
    log: list[Logged] = field(default_factory=list)
    snapshots: dict[int, dict[bytes, bytes]] = field(default_factory=dict)


def _condition(rng, model, keyspace):
    """A random condition and whether it holds in ``model``, the model's own decision."""
    key = b"k%03d" % rng.randrange(keyspace)
    kind = rng.choice(["equals", "absent", "present"])
    if kind == "equals":
        value = model[key] if key in model and rng.random() < 0.6 else b"v%d-" % rng.randrange(1000)
        return key, {"equals": value}, model.get(key) == value
    if kind == "absent":
        return key, {"absent": True}, key not in model
    return key, {"present": True}, key in model


def build(path: str, seed: int, n: int = 80, snapshot_after: tuple[int, ...] = (25, 55), keyspace: int = 40) -> Store:
    """Plain batches and conditional writes (about a third; the model decides
    each one and the store must agree), with snapshots in several chunks."""
    rng = random.Random(seed)
    store = Store(path)
    model: dict[bytes, bytes] = {}
    with kvstore.open(path, segment_bytes=4096) as db:
        for i in range(n):
            writes = random_ops(rng, keyspace, text=False)
            if rng.random() < 0.35:
                conds = [_condition(rng, model, keyspace) for _ in range(rng.randint(1, 2))]
                with db.transaction() as t:
                    for key, how, _ in conds:
                        t.require(key, **how)
                    write_ops(t, writes)
                holds = all(ok for _, _, ok in conds)
                assert t.succeeded == holds and t.lsn is not None
                entry = Logged(t.lsn, writes, len(conds), holds)
            else:
                with db.batch() as b:
                    write_ops(b, writes)
                assert b.lsn is not None
                entry = Logged(b.lsn, writes, 0, True)
            if entry.applied:
                apply(model, writes)
            store.log.append(entry)
            if i + 1 in snapshot_after:
                store.snapshots[take_snapshot(db)] = dict(model)
        assert dict(db.scan()) == model
    return store


def model_rows(store: Store, start: int, end: int | None = None, snapshot_rows: int | None = None) -> list[tuple]:
    """The rows of LSNs ``start..end`` as the model says: insert or update by
    whether the key existed, the pre-image the value it had, a range delete one
    delete per key that existed; a failed conditional write nothing."""
    out = []
    if snapshot_rows is not None:
        out += [(k, v, INSERT, snapshot_rows, -1) for k, v in sorted(store.snapshots[snapshot_rows].items())]
    state: dict[bytes, bytes] = {}
    for e in store.log:
        if end is not None and e.lsn > end:
            break
        if not e.applied:
            continue
        rows = []
        for j, op in enumerate(e.writes):
            i = e.first_index + j
            if op[0] == 1:
                if op[1] in state:
                    rows += [(op[1], state[op[1]], PRE, e.lsn, i), (op[1], op[2], POST, e.lsn, i)]
                else:
                    rows.append((op[1], op[2], INSERT, e.lsn, i))
                state[op[1]] = op[2]
            elif op[0] == 2:
                if op[1] in state:
                    rows.append((op[1], state.pop(op[1]), DELETE, e.lsn, i))
            else:
                for k in sorted(k for k in state if op[1] <= k < op[2]):
                    rows.append((k, state.pop(k), DELETE, e.lsn, i))
        if e.lsn >= start:
            out += rows
    return out


@pytest.mark.parametrize("seed", [7, 19])
def test_random_store_against_the_model(walkv_spark, tmp_path, seed):
    path = str(tmp_path / "store")
    store = build(path, seed)
    s1, s2 = sorted(store.snapshots)
    everything = model_rows(store, 1)
    # The model's store exercises what the vocabulary decides.
    types = {r[2] for r in everything}
    assert types == {INSERT, PRE, POST, DELETE}
    failed = {e.lsn for e in store.log if not e.applied}
    assert failed and any(e.lsn not in failed for e in store.log if e.first_index)  # both outcomes
    ranges = [(r[3], r[4]) for r in everything if r[2] == DELETE]
    assert len(ranges) > len(set(ranges))  # some range delete deleted several keys

    got = rows_of(read(walkv_spark, path, startingLsn=1))
    check(got, everything)
    assert not {r[3] for r in got} & failed
    # Across a snapshot boundary: rebuilt from the first snapshot (several chunks: several tasks), read past the
    # second one's LSN.
    check(rows_of(read(walkv_spark, path, startingLsn=s1 + 3, endingLsn=s2 + 4)),
          model_rows(store, s1 + 3, s2 + 4))
    check(rows_of(read(walkv_spark, path, startingLsn=s2 + 1)), model_rows(store, s2 + 1))
    check(rows_of(read(walkv_spark, path)), model_rows(store, s2 + 1))  # the default: after s2
    check(rows_of(read(walkv_spark, path, startingFrom="snapshot")),
          model_rows(store, s2 + 1, snapshot_rows=s2))


def test_stream_in_capped_micro_batches_across_snapshots(walkv_spark, tmp_path):
    """Each micro-batch rebuilds its pre-images from the newest snapshot at or
    before its start; from LSN 1, capped, the micro-batches cross both snapshots."""
    path = str(tmp_path / "store")
    store = build(path, 23, n=60, snapshot_after=(20, 40))
    got: list = []

    def collect(df, batch_id):
        got.extend(rows_of(df))

    q = (walkv_spark.readStream.format("walkv").option("changeVocabulary", "delta")
         .option("maxRecordsPerTrigger", 12).load(path).writeStream.foreachBatch(collect)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    assert len([p for p in q.recentProgress if p["numInputRows"] > 0]) >= len(store.log) // 12
    check(got, model_rows(store, 1))


def test_the_option_is_checked():
    from kvstore.spark.options import parse

    opts = parse({"path": "/x", "changeVocabulary": "Delta"})
    assert opts.vocabulary == "delta" and opts.needs_images and not opts.debezium
    assert parse({"path": "/x"}).vocabulary == "walkv" and not parse({"path": "/x"}).needs_images
    assert parse({"path": "/x", "changeVocabulary": "delta", "startingFrom": "snapshot"}).starting_from_snapshot
    with pytest.raises(ValueError, match="changeVocabulary must be"):
        parse({"path": "/x", "changeVocabulary": "cdc"})
    for other in ({"table": "state"}, {"format": "debezium"}):
        with pytest.raises(ValueError, match="changeVocabulary=delta applies to table=changes"):
            parse({"path": "/x", "changeVocabulary": "delta", **other})
    with pytest.raises(ValueError, match="for streams"):
        parse({"path": "/x", "startingFrom": "snapshot"})
