"""``walkv export`` across keyspaces, and its MERGE shape: through ``main()``
in this process, on the suite's one SparkSession (see tests/test_cli.py's
export test for why)."""

from __future__ import annotations

import json
import os

import pytest

import kvstore

pytestmark = pytest.mark.spark


def contents(db):
    """{(keyspace, key): value} of every keyspace of an open store."""
    out = {("", k): v for k, v in db.scan()}
    for ks in db.keyspaces():
        out.update({(ks, k): v for k, v in db.keyspace(ks).scan()})
    return out


def parquet_rows(spark, path):
    return spark.read.parquet(path).collect()


def test_export_takes_every_keyspace_and_says_so(tmp_path, spark, capsys):
    from kvstore.cli import main

    s = str(tmp_path / "s")
    with kvstore.open(s) as db:
        db.update({b"d%02d" % i: b"default" for i in range(5)})
        db.keyspace("orders").update({b"o%02d" % i: b"order" for i in range(7)})
        db.snapshot()
        db.keyspace("users").put(b"u", b"only in the log")
        expected = contents(db)
    out = str(tmp_path / "out")
    assert main(["export", s, out, "--table", "state"]) == 0
    printed = capsys.readouterr().out
    assert "every keyspace" in printed and "orders 7" in printed and "users 1" in printed
    got = {(r["keyspace"], bytes(r["key"])): bytes(r["value"]) for r in parquet_rows(spark, os.path.join(out, "state"))}
    assert got == expected
    with open(os.path.join(out, "_walkv_export.json")) as f:
        meta = json.load(f)
    assert meta["keyspace"] == "*" and meta["tables"]["state"]["keyspaces"] == {"": 5, "orders": 7, "users": 1}

    one = str(tmp_path / "one")
    assert main(["export", s, one, "--table", "state", "--keyspace", "orders"]) == 0
    assert "keyspace 'orders' only" in capsys.readouterr().out
    rows = parquet_rows(spark, os.path.join(one, "state"))
    assert {r["keyspace"] for r in rows} == {"orders"} and len(rows) == 7


def test_incremental_merge_rows_apply_to_the_store(tmp_path, spark, capsys):
    """--incremental --merge: the first run holds every key; the next the
    changed keys only, a range delete and a dropped keyspace as tombstones;
    MERGEd in lsn order they give the store."""
    from kvstore.cli import main

    s, out = str(tmp_path / "s"), str(tmp_path / "out")
    with kvstore.open(s) as db:
        db.update({b"k%02d" % i: b"v" for i in range(30)})
        db.keyspace("users").update({b"u%02d" % i: b"user" for i in range(5)})
        db.snapshot()
    args = ["export", s, out, "--table", "state", "--incremental", "--merge"]
    assert main(args) == 0
    first = parquet_rows(spark, os.path.join(out, "state_merge"))
    assert len(first) == 35 and not any(r["_deleted"] for r in first)
    capsys.readouterr()
    with kvstore.open(s) as db:
        db.put(b"k00", b"changed")
        db.delete(b"k01")
        db.delete_range(b"k10", b"k20")
        db.put(b"k15", b"back")
        db.drop_keyspace("users")
        db.keyspace("new").put(b"n", b"1")
        expected = contents(db)
    assert main(args) == 0
    printed = capsys.readouterr().out
    rows = parquet_rows(spark, os.path.join(out, "state_merge"))
    run = [r for r in rows if r["_export_lsn"] == max(x["_export_lsn"] for x in rows)]
    # k00, k01, k10..k19 (k15 deleted, then put back), u00..u04, n
    assert len(run) == 1 + 1 + 10 + 5 + 1, run
    assert sum(r["_deleted"] for r in run) == 1 + 9 + 5
    assert "18 rows appended to state_merge/" in printed and "15 of them tombstones" in printed
    merged: dict = {}
    for r in sorted(rows, key=lambda r: r["lsn"]):
        k = (r["keyspace"], bytes(r["key"]))
        if r["_deleted"]:
            assert r["value"] is None
            merged.pop(k, None)
        else:
            merged[k] = bytes(r["value"])
    assert merged == expected
    assert main(args) == 0  # nothing new: nothing appended
    assert len(parquet_rows(spark, os.path.join(out, "state_merge"))) == len(rows)


def test_commit_timestamps_are_timestamp_micros_not_int96(tmp_path, spark):
    import pyarrow.parquet as pq

    from kvstore.spark.export import TIMESTAMP_CONF, export

    s, out = str(tmp_path / "s"), str(tmp_path / "out")
    with kvstore.open(s) as db:
        db.put(b"a", b"1")
        db.put(b"b", b"2")
    before = spark.conf.get(TIMESTAMP_CONF, None)
    export(s, out, table="changes")
    assert spark.conf.get(TIMESTAMP_CONF, None) == before  # the session's setting is left as it was
    files = [os.path.join(out, "changes", n) for n in os.listdir(os.path.join(out, "changes")) if n.endswith(".parquet")]
    assert files
    for f in files:
        column = pq.ParquetFile(f).schema.column(pq.ParquetFile(f).schema_arrow.get_field_index("_commit_timestamp"))
        assert column.physical_type == "INT64" and "timeUnit=microseconds" in str(column.logical_type), column
