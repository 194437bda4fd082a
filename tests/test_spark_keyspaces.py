"""The Spark tables and keyspaces: every table's ``keyspace`` column, the
``keyspace`` option (one keyspace, or ``*``), filters on ``keyspace`` that
prune snapshot sections, and one read through a Spark session. The readers
are driven as Spark drives them (pickled partitions), without a session
except where said."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

import kvstore  # noqa: E402
from kvstore.entry.codec import END_OF_KEYS  # noqa: E402
from kvstore.spark.options import parse  # noqa: E402
from kvstore.spark.partitions import ChunkPartition  # noqa: E402
from kvstore.spark.source import WalkvPushdownReader  # noqa: E402
from tests.test_spark_unit import read_all, reader, rows, ship  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Keyspaces "" / users / orders in the snapshot; after it: writes in
    each, a batch spanning two, a drop of orders, a new keyspace logs."""
    path = str(tmp_path_factory.mktemp("spark-ks") / "store")
    with kvstore.open(path, snapshot_chunk_bytes=4096) as db:
        db.update({b"d%03d" % i: b"default" for i in range(50)})
        db.keyspace("users").update({b"u%03d" % i: b"user %d" % i for i in range(300)})
        db.keyspace("orders").update({b"o%03d" % i: b"order" for i in range(10)})
        snap = db.snapshot()
        db.keyspace("users").put(b"u000", b"changed")
        with db.batch() as b:
            b.delete(b"u001", keyspace="users")
            b.put(b"d000", b"changed too")
        db.drop_keyspace("orders")
        db.keyspace("logs").put(b"l", b"only in the log")
        expected = {ks: dict(db.keyspace(ks).scan()) if ks else dict(db.scan()) for ks in ("", "users", "orders",
                                                                                            "logs")}
    return path, snap, expected


def test_snapshot_table_reads_one_keyspace_or_every_one(store):
    path, snap, _ = store
    users = read_all(reader(path, table="snapshot", keyspace="users"))
    assert {k for k, _v, _l, ks in rows(users, ["key", "value", "lsn", "keyspace"]) if ks == "users"} == \
        {b"u%03d" % i for i in range(300)}
    assert set(users.column("keyspace").to_pylist()) == {"users"}
    default = read_all(reader(path, table="snapshot"))
    assert set(default.column("keyspace").to_pylist()) == {""} and default.num_rows == 50
    every = rows(read_all(reader(path, table="snapshot", keyspace="*")), ["keyspace"])
    assert sorted({ks for (ks,) in every}) == ["", "orders", "users"] and len(every) == 360


def test_state_of_a_keyspace_equals_the_store(store):
    path, _snap, expected = store
    for ks in ("", "users", "orders", "logs"):
        got = rows(read_all(reader(path, table="state", keyspace=ks)), ["key", "value", "keyspace"])
        assert {k: v for k, v, _ in got} == expected[ks], ks
        assert {s for _k, _v, s in got} <= {ks}


def test_changes_carry_the_keyspace_and_a_drop(store):
    path, snap, _ = store
    every = rows(read_all(reader(path, table="changes", keyspace="*")),
                 ["_commit_version", "_change_type", "key", "end_key", "keyspace"])
    lsn = snap.lsn
    assert every == [(lsn + 1, "upsert", b"u000", None, "users"), (lsn + 2, "delete", b"u001", None, "users"),
                     (lsn + 2, "upsert", b"d000", None, ""), (lsn + 3, "delete_range", b"", END_OF_KEYS, "orders"),
                     (lsn + 4, "upsert", b"l", None, "logs")]
    assert rows(read_all(reader(path, table="changes")), ["key"]) == [(b"d000",)]
    assert rows(read_all(reader(path, table="changes", keyspace="users")), ["key"]) == [(b"u000",), (b"u001",)]


def test_keyspace_filters_prune_snapshot_sections(store):
    from pyspark.sql.datasource import EqualTo, In

    path, snap, _ = store
    r = ship(WalkvPushdownReader(parse({"path": path, "table": "snapshot", "keyspace": "*"})))
    every = r.partitions()
    assert len(every) > 2  # users' 300 pairs fill more than one chunk
    assert list(r.pushFilters([EqualTo(("keyspace",), "orders")])) == []  # applied exactly: taken
    only = r.partitions()
    assert [p.keyspace for p in only] == ["orders"] and all(isinstance(p, ChunkPartition) for p in only)
    assert all(p.chunk.section == "ks:orders" for p in only)
    r.pushFilters([In(("keyspace",), ("", "nope"))])
    assert {p.keyspace for p in r.partitions()} == {""}
    r.pushFilters([EqualTo(("keyspace",), "users"), EqualTo(("keyspace",), "orders")])
    assert r.partitions() == []


def test_state_of_every_keyspace_equals_the_store(store):
    """keyspace=*: the snapshot's sections, each with the tail applied (orders
    dropped: no rows), and logs, a keyspace only the log holds."""
    path, _snap, expected = store
    got = rows(read_all(reader(path, table="state", keyspace="*")), ["keyspace", "key", "value"])
    by_keyspace: dict[str, dict[bytes, bytes]] = {ks: {} for ks in expected}
    for ks, k, v in got:
        by_keyspace[ks][k] = v
    assert by_keyspace == expected
    assert len(got) == sum(len(m) for m in expected.values())  # no key twice


@pytest.mark.parametrize("options,columns", [
    ({"format": "debezium"}, ["source", "key", "before", "after", "op"]),
    ({"changeVocabulary": "delta"}, ["keyspace", "_commit_version", "_op_index", "_change_type", "key", "value"]),
])
def test_images_of_every_keyspace_are_each_keyspace_s(store, options, columns):
    """keyspace=* with pre-images: the rows of every keyspace read alone, each
    naming its keyspace; the drop of orders deletes its 10 keys."""
    path, _snap, _ = store
    every = sorted(map(repr, rows(read_all(reader(path, keyspace="*", **options)), columns)))
    alone = sorted(repr(r) for ks in ("", "users", "orders", "logs")
                   for r in rows(read_all(reader(path, keyspace=ks, **options)), columns))
    assert every == alone
    named = rows(read_all(reader(path, keyspace="*", **options)), columns)
    if "keyspace" in columns:
        spaces = [r[0] for r in named]
    else:
        spaces = [r[0]["keyspace"] for r in named]
    assert spaces.count("orders") == 10 and spaces.count("logs") == 1 and spaces.count("users") >= 2


def test_keyspace_option_errors(store):
    with pytest.raises(ValueError, match="keyspace name"):
        parse({"path": store[0], "keyspace": "no/slash"})


@pytest.mark.spark
def test_a_spark_session_filters_on_the_keyspace_column(walkv_spark, store):
    path, _snap, _ = store
    df = walkv_spark.read.format("walkv").option("table", "snapshot").option("keyspace", "*").load(path)
    counts = {r["keyspace"]: r["count"] for r in df.groupBy("keyspace").count().collect()}
    assert counts == {"": 50, "users": 300, "orders": 10}
    assert df.where("keyspace = 'orders'").count() == 10
