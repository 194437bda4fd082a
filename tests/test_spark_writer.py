"""The walkv writer: df.write.format("walkv") appends or overwrites as one
atomic batch (one LSN), deletes by a deleted/_change_type column, aborts
leaving nothing, refuses a locked store and an archive; a commit killed with
SIGKILL at any moment leaves every row or none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import kvstore
from kvstore.archive import Archiver

pytest.importorskip("pyspark")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def contents(path):
    with kvstore.open(path) as db:
        return dict(db.scan()), db.last_lsn


def batches(rows: list[dict[str, bytes]]):
    """``rows`` as Spark hands them to the writer's tasks: Arrow record batches."""
    import pyarrow as pa

    return iter([pa.RecordBatch.from_pylist(rows[i:i + 500]) for i in range(0, len(rows), 500)])


def staging_left(path):
    """What a write job left of spark-staging/: [] when it left no directory at all."""
    d = os.path.join(path, "spark-staging")
    return [n for n in os.listdir(d)] or ["(an empty spark-staging/)"] if os.path.isdir(d) else []



@pytest.mark.spark
def test_append_overwrite_and_deletes_are_one_batch_each(walkv_spark, tmp_path):
    spark = walkv_spark
    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        db.put(b"old", b"1")
        db.put(b"k0001", b"before")
    rows = [(f"k{i:04d}", f"v{i}") for i in range(400)]
    spark.createDataFrame(rows, "key string, value string").repartition(4).write.format("walkv") \
        .mode("append").save(path)
    got, lsn = contents(path)
    assert lsn == 3  # the 4 tasks' rows: one entry
    assert got == {b"old": b"1", **{k.encode(): v.encode() for k, v in rows}}
    assert staging_left(path) == []

    dels = spark.createDataFrame([(f"k{i:04d}".encode(), None, True) for i in range(0, 400, 2)] +
                                 [(b"new", b"x", False)], "key binary, value binary, deleted boolean")
    dels.write.format("walkv").mode("append").save(path)
    got, lsn = contents(path)
    assert lsn == 4
    assert got == {b"old": b"1", b"new": b"x", **{k.encode(): v.encode() for i, (k, v) in enumerate(rows) if i % 2}}

    # A changes read of another store, written here: _change_type decides.
    other = str(tmp_path / "other")
    with kvstore.open(other) as db:
        db.put(b"a", b"A")
        db.put(b"old", b"2")
        db.delete(b"new")
    changes = spark.read.format("walkv").option("table", "changes").load(other).select("key", "value", "_change_type")
    changes.write.format("walkv").mode("append").save(path)
    got, _ = contents(path)
    assert got[b"a"] == b"A" and got[b"old"] == b"2" and b"new" not in got

    spark.createDataFrame([("only", "one")], "key string, value string").write.format("walkv") \
        .mode("overwrite").save(path)
    got, lsn = contents(path)
    assert got == {b"only": b"one"}


@pytest.mark.spark
def test_abort_locked_store_and_archive_are_refused(walkv_spark, tmp_path):
    spark = walkv_spark
    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        db.put(b"keep", b"1")
    before = contents(path)
    # A task fails (a null key): the job aborts, nothing is written, nothing is left.
    bad = spark.createDataFrame([("a", "1"), (None, "2"), ("c", "3")], "key string, value string").repartition(3)
    with pytest.raises(Exception, match="null key"):
        bad.write.format("walkv").mode("append").save(path)
    assert contents(path) == before
    assert staging_left(path) == []
    df = spark.createDataFrame([("a", "1")], "key string, value string")
    with kvstore.open(path):  # held open by this process: the write names the lock
        with pytest.raises(Exception, match="LockedError|lock"):
            df.write.format("walkv").mode("append").save(path)
    archive = str(tmp_path / "archive")
    Archiver(path, archive).ship_once()
    with pytest.raises(Exception, match="is a walkv archive"):
        df.write.format("walkv").mode("append").save(archive)
    with pytest.raises(Exception, match="local store directory"):
        df.write.format("walkv").mode("append").save("s3://bucket/store")


CHILD = textwrap.dedent("""
    import sys
    from kvstore.spark.writer import WalkvWriter
    from tests.test_spark_writer import batches
    path, prefix = sys.argv[1], sys.argv[2]
    w = WalkvWriter(path, ["key", "value"], False)
    msgs = [w.write(batches([{"key": b"%s-%d-%05d" % (prefix.encode(), t, i), "value": b"v" * 200}
                             for i in range(4000)])) for t in range(4)]
    print("ready", flush=True)
    w.commit(msgs)
    print("done", flush=True)
""")


@pytest.mark.crash
def test_commit_killed_at_any_moment_is_all_or_nothing(tmp_path):
    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        db.put(b"base", b"1")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    outcomes = []
    for n, delay in enumerate([0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.4, 5.0]):
        prefix = f"p{n}"
        p = subprocess.Popen([sys.executable, "-c", CHILD, path, prefix], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        assert p.stdout is not None and p.stderr is not None
        line = p.stdout.readline().strip()
        assert line == b"ready", p.stderr.read().decode()[-2000:]
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        got, _ = contents(path)
        mine = [k for k in got if k.startswith(prefix.encode() + b"-")]
        assert len(mine) in (0, 16000), (delay, len(mine))
        assert got[b"base"] == b"1"
        outcomes.append(len(mine))
    assert outcomes[-1] == 16000  # given time, the commit completes


LIMIT = (64 << 20) - 64  # what one batch of a store opened with the default max_record_bytes holds


def sized_rows(n: int, encoded: int, overwrite: bool) -> list[dict[str, bytes]]:
    """``n`` rows whose batch (with overwrite's range delete first) msgpack
    encodes to exactly ``encoded`` bytes, measured with msgpack itself."""
    import msgpack

    from kvstore.entry.codec import END_OF_KEYS, OP_DELETE_RANGE, OP_PUT

    rows = [{"key": b"k%05d" % i, "value": b"v" * ((encoded - 4096) // n)} for i in range(n)]
    head = [[OP_DELETE_RANGE, b"", END_OF_KEYS]] if overwrite else []
    size = len(msgpack.packb(head + [[OP_PUT, r["key"], r["value"]] for r in rows], use_bin_type=True))
    rows[-1]["value"] += b"v" * (encoded - size)  # bin32 either way: one more byte of value, one more encoded
    assert len(msgpack.packb(head + [[OP_PUT, r["key"], r["value"]] for r in rows], use_bin_type=True)) == encoded
    return rows


@pytest.mark.parametrize("overwrite", [False, True])
def test_one_byte_over_one_entry_is_a_staged_group_at_the_limit_one_batch(tmp_path, overwrite):
    """Issue 23 counted the encoded batch exactly to refuse one byte over the
    record limit; issue 38 lifts the limit: one byte over is a staged group
    (parts, then a commit: every row at the commit's LSN), at the limit it
    is still one batch (one LSN)."""
    from kvstore.entry import decode
    from kvstore.entry.groups import commit_of
    from kvstore.spark.writer import WalkvWriter

    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        db.put(b"base", b"1")
    w = WalkvWriter(path, ["key", "value"], overwrite)
    rows = sized_rows(64, LIMIT + 1, overwrite)
    w.commit([w.write(batches(rows[:32])), w.write(batches(rows[32:]))])
    got, lsn = contents(path)
    assert got == {**({} if overwrite else {b"base": b"1"}), **{r["key"]: r["value"] for r in rows}}
    with kvstore.open(path, readonly=True) as db:
        assert db.last_lsn == lsn
    payload = dict(wal_entries(path, lsn))[lsn]
    commit = commit_of(decode(payload, lsn))
    assert commit is not None and commit.first_part_lsn == 2 and commit.part_count == lsn - 2 > 1
    assert staging_left(path) == []
    w = WalkvWriter(path, ["key", "value"], overwrite)
    rows = sized_rows(64, LIMIT, overwrite)
    w.commit([w.write(batches(rows[:32])), w.write(batches(rows[32:]))])
    got, last = contents(path)
    assert last == lsn + 1 and len(got) == (64 if overwrite else 65) and staging_left(path) == []


def wal_entries(path, lsn):
    """``(lsn, payload)`` of the store's log up to ``lsn``."""
    import wal

    with wal.open(os.path.join(path, "wal")) as log:
        return list(log.read(1, lsn))


@pytest.mark.spark
def test_overwrite_just_over_the_limit_commits_whole(walkv_spark, tmp_path):
    """Issue 23's case, 67,108,784 bytes of keys and values overwritten, over
    one entry's limit once encoded: refused until issue 38, a staged group
    now, every row or none."""
    from pyspark.sql import functions as F

    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        db.put(b"base", b"1")
    counted = 67_108_784
    n = 64
    value = (counted - n * (6 + 8)) // n
    last = counted - n * (6 + 8) - (n - 1) * value
    df = walkv_spark.range(n).select(
        F.format_string("k%05d", "id").alias("key"),
        F.expr(f"repeat('v', IF(id = {n - 1}, {last}, {value}))").alias("value"))
    df.repartition(2).write.format("walkv").mode("overwrite").save(path)
    got, _ = contents(path)
    assert sorted(got) == [b"k%05d" % i for i in range(n)]
    assert len(got[b"k%05d" % (n - 1)]) == last and staging_left(path) == []


def test_a_group_commit_that_fails_part_way_applies_nothing_and_leaves_no_staging(tmp_path):
    """The second task's staged file lost its tail: the first one's part is
    in the log already, so the group is aborted; nothing applies, and the
    job leaves no ``spark-staging/``."""
    from kvstore.entry import decode
    from kvstore.entry.codec import OP_GROUP_ABORT
    from kvstore.entry.groups import group_code
    from kvstore.spark.writer import WalkvWriter
    from wal.errors import CorruptionError

    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        db.put(b"base", b"1")
    w = WalkvWriter(path, ["key", "value"], True, "job", 1)
    rows = [{"key": b"k%05d" % i, "value": b"v" * 100} for i in range(2000)]
    msgs = [w.write(batches(rows[:1000])), w.write(batches(rows[1000:]))]
    with open(msgs[1].path, "r+b") as f:
        f.truncate(os.path.getsize(msgs[1].path) // 2)
    with pytest.raises(CorruptionError, match="staged file holds"):
        w.commit(msgs)
    got, lsn = contents(path)
    assert got == {b"base": b"1"} and staging_left(path) == []
    payload = dict(wal_entries(path, lsn))[lsn]
    assert group_code(decode(payload, lsn)) == OP_GROUP_ABORT
    with kvstore.open(path) as db:
        assert db.committed_version("job") is None
