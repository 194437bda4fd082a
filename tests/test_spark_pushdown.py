"""Filter pushdown (PySpark 4.1+ with spark.sql.python.filterPushdown.enabled):
conditions on key and _commit_version prune snapshot chunks and log
segments (counted as the scan's partitions), and results are unchanged."""

from __future__ import annotations

import pytest

import kvstore
from tests.test_spark_helpers import Built, apply, as_bytes

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def pushing(spark):
    from kvstore.spark import register
    from kvstore.spark.compat import HAS_FILTER_PUSHDOWN, PUSHDOWN_CONF

    if not HAS_FILTER_PUSHDOWN:
        pytest.skip("this PySpark has no filter pushdown for Python data sources (4.1+)")
    spark.conf.set(PUSHDOWN_CONF, "true")
    register(spark)
    yield spark
    spark.conf.set(PUSHDOWN_CONF, "false")
    register(spark)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """2000 keys in a snapshot of many chunks, then 200 more batches in many segments."""
    path = str(tmp_path_factory.mktemp("pushdown") / "store")
    b = Built(path)
    with kvstore.open(path, segment_bytes=4096) as db:
        def batch(ops):
            with db.batch() as wb:
                for op in ops:
                    if op[0] == 1:
                        wb.put(op[1], op[2])
                    else:
                        wb.delete(op[1])
            b.batches.append((wb.lsn, ops))
            apply(b.model, ops)
            b.last_lsn = wb.lsn

        for i in range(0, 2000, 50):
            batch([[1, b"k%04d" % j, b"v%03d-" % j * 40] for j in range(i, i + 50)])
        snap = db.snapshot(chunk_bytes=200)
        b.snapshots[snap.lsn] = dict(b.model)
        for i in range(200):
            batch([[1, b"k%04d" % ((i * 7) % 2000), b"w%d-" % i * 10], [2, b"k%04d" % ((i * 13) % 2000)]])
    return b



def scan(spark, built, table, where=None, **options):
    r = spark.read.format("walkv").option("table", table)
    for k, v in options.items():
        r = r.option(k, v)
    df = r.load(built.path)
    return df.where(where) if where is not None else df


def test_key_filters_prune_snapshot_chunks(pushing, built):
    spark = pushing
    snap = built.snapshots[max(built.snapshots)]
    keys = sorted(snap)
    everything = scan(spark, built, "snapshot")
    total = everything.rdd.getNumPartitions()
    assert total >= 8
    cases = [
        (f"key = X'{keys[5].hex()}'", lambda k: k == keys[5]),
        (f"key >= X'{keys[10].hex()}' AND key < X'{keys[20].hex()}'", lambda k: keys[10] <= k < keys[20]),
        (f"key > X'{keys[-4].hex()}'", lambda k: k > keys[-4]),
        (f"key <= X'{keys[3].hex()}'", lambda k: k <= keys[3]),
        (f"key IN (X'{keys[1].hex()}', X'{keys[2].hex()}')", lambda k: k in (keys[1], keys[2])),
    ]
    for where, want in cases:
        df = scan(spark, built, "snapshot", where)
        assert df.rdd.getNumPartitions() < total / 2, where
        assert {as_bytes(r.key): as_bytes(r.value) for r in df.collect()} == {k: v for k, v in snap.items() if want(k)}, where
    # LIKE 'prefix%' on string keys.
    df = scan(spark, built, "snapshot", "key LIKE 'k001%'", keyFormat="string")
    assert df.rdd.getNumPartitions() < total / 2
    assert sorted(r.key.encode() for r in df.collect()) == [k for k in keys if k.startswith(b"k001")]


def test_key_filters_prune_the_state_and_lsn_filters_the_log(pushing, built):
    spark = pushing
    keys = sorted(built.model)
    total = scan(spark, built, "state").rdd.getNumPartitions()
    where = f"key >= X'{keys[30].hex()}' AND key < X'{keys[40].hex()}'"
    df = scan(spark, built, "state", where)
    assert df.rdd.getNumPartitions() < total / 2
    assert {as_bytes(r.key): as_bytes(r.value) for r in df.collect()} == {k: v for k, v in built.model.items()
                                                              if keys[30] <= k < keys[40]}
    one = scan(spark, built, "state", f"key = X'{keys[7].hex()}'").collect()
    assert [(as_bytes(r.key), as_bytes(r.value)) for r in one] == [(keys[7], built.model[keys[7]])]

    log = scan(spark, built, "changes", startingLsn="earliest")
    segments = log.rdd.getNumPartitions()
    assert segments >= 6
    lo, hi = 100, 104
    df = scan(spark, built, "changes", f"_commit_version BETWEEN {lo} AND {hi}", startingLsn="earliest")
    assert df.rdd.getNumPartitions() <= 2
    got = sorted((r._commit_version, r._op_index) for r in df.collect())
    assert got == [(r[4], r[5]) for r in built.change_rows(lo, hi)]
    df = scan(spark, built, "changes", f"_commit_version IN ({lo}, {hi})", startingLsn="earliest")
    assert sorted({r._commit_version for r in df.collect()}) == [lo, hi]
    assert df.rdd.getNumPartitions() < segments


def explained(df, capsys) -> str:
    capsys.readouterr()
    df.explain(mode="formatted")  # a scan's PushedFilters, as Parquet's
    return capsys.readouterr().out


def test_pushdown_shows_in_explain_without_a_setting_before_register(walkv_spark, built, capsys):
    """register() turns the setting on when it was left unset; the filters a
    scan applies exactly are its PushedFilters, and Spark filters no more;
    one it only prunes by (a key range on changes) stays Spark's Filter."""
    from kvstore.spark import register
    from kvstore.spark.compat import HAS_FILTER_PUSHDOWN, PUSHDOWN_CONF

    if not HAS_FILTER_PUSHDOWN:
        pytest.skip("this PySpark has no filter pushdown for Python data sources (4.1+)")
    spark = walkv_spark
    spark.conf.unset(PUSHDOWN_CONF)
    register(spark)
    assert spark.conf.get(PUSHDOWN_CONF) == "true"
    snap = built.snapshots[max(built.snapshots)]
    key = sorted(snap)[5]
    df = scan(spark, built, "snapshot", f"key = X'{key.hex()}' AND keyspace = ''")
    plan = explained(df, capsys)
    assert "PushedFilters: [EqualTo(key," in plan and "EqualTo(keyspace," in plan, plan
    assert "Filter" not in plan.split("(1) BatchScan")[0], plan  # no Spark-side Filter in the tree
    assert [(as_bytes(r.key), as_bytes(r.value)) for r in df.collect()] == [(key, snap[key])]

    df = scan(spark, built, "changes", "_commit_version > 150 AND key >= X'6b30'", startingLsn="earliest")
    plan = explained(df, capsys)
    assert "PushedFilters: [GreaterThan(_commit_version,150)]" in plan, plan
    assert "Filter" in plan.split("(1) BatchScan")[0], plan  # the key range: Spark still evaluates it
    got = sorted((r._commit_version, r._op_index) for r in df.collect())
    assert got == [(r[4], r[5]) for r in built.change_rows(151, built.last_lsn) if r[0] >= b"k0"]
