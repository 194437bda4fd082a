"""A store's directory deleted or replaced under its open writer (``rm -rf STORE``),
and what readers make of a new store at the same path that inherits the old
one's ``snapshots/``. Real files, real subprocesses, a real Spark session."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import kvstore
import snapshot
import wal.log_writer
from kvstore.cli.files import verify_store
from kvstore.cli.progress import Reporter
from wal.errors import StoreVanishedError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _no_durability_claim(message: str) -> None:
    """Nothing written by a log whose directory vanished is durable there."""
    assert "are durable" not in message and "is durable" not in message, message
    assert "Nothing this log wrote can be counted on as durable" in message, message


def _make_store_in_child(path: str, keys: list[bytes]) -> str:
    """Create a store at ``path`` in another process (as another program
    would), put ``keys``, close it; return its store id."""
    code = textwrap.dedent(f"""
        import kvstore
        with kvstore.open({path!r}) as db:
            for k in {keys!r}:
                db.put(k, b"new")
            print(db.store_id)
    """)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    return out.stdout.strip()


def test_rm_rf_under_open_writer_is_refused_at_the_next_roll(tmp_path):
    path = str(tmp_path / "store")
    db = kvstore.open(path, segment_bytes=4096)
    for i in range(10):
        db.put(b"old%03d" % i, b"v" * 100)
    db.snapshot()
    shutil.rmtree(path)
    acked = 0
    with pytest.raises(StoreVanishedError) as err:
        for i in range(200):
            db.put(b"dead%03d" % i, b"x" * 100)
            acked += 1
    assert acked < 4096 // 100  # at the latest at the next roll of a 4 KiB segment
    _no_durability_claim(str(err.value))
    assert "was deleted" in str(err.value)
    with pytest.raises(StoreVanishedError):
        db.put(b"more", b"x")
    with pytest.raises(StoreVanishedError):
        db.snapshot()
    assert not os.path.exists(path)  # snapshot() recreated nothing
    with pytest.raises(StoreVanishedError) as err:
        db.close()
    _no_durability_claim(str(err.value))
    assert not os.path.exists(path)
    db.close()  # idempotent


@pytest.mark.parametrize("sync", ["always", "batch", "none"])
def test_rm_rf_then_sync_snapshot_or_close_fails_without_recreating(tmp_path, sync):
    path = str(tmp_path / "store")
    db = kvstore.open(path, sync=sync)
    db.put(b"a", b"1")
    shutil.rmtree(path)
    with pytest.raises(StoreVanishedError) as err:
        db.snapshot()
    _no_durability_claim(str(err.value))
    assert not os.path.exists(path)
    with pytest.raises(StoreVanishedError):
        db.sync()
    with pytest.raises(StoreVanishedError):
        db.put(b"b", b"2")
    with pytest.raises(StoreVanishedError):
        db.close()
    assert not os.path.exists(path)


@pytest.mark.parametrize("sync", ["always", "batch", "none"])
def test_put_right_after_rm_rf_is_refused(tmp_path, monkeypatch, sync):
    """Issue 23: with sync="always" the directory was checked about once a
    second, so puts right after ``rm -rf`` were acknowledged (LSNs 2-4) into
    deleted files. Every fsync group now checks it before acknowledging (no
    patching here). "batch"/"none" appends check it every DIRECTORY_CHECK_US
    (about a second; 0 here: every group checks, shown without timing)."""
    if sync != "always":
        monkeypatch.setattr(wal.log_writer, "DIRECTORY_CHECK_US", 0)
    path = str(tmp_path / "store")
    db = kvstore.open(path, sync=sync)
    db.put(b"a", b"1")
    shutil.rmtree(path)
    with pytest.raises(StoreVanishedError) as err:
        db.put(b"b", b"2")
    _no_durability_claim(str(err.value))
    with pytest.raises(StoreVanishedError):
        db.close()
    assert not os.path.exists(path)


def test_no_durable_put_from_8_threads_is_acknowledged_after_rm_rf(tmp_path):
    """8 threads put (sync="always", so groups of several) while the store is
    deleted: no put that began after ``rm -rf`` returned is acknowledged."""
    path = str(tmp_path / "store")
    db = kvstore.open(path, sync="always")
    gone = threading.Event()
    late_acks: list[int] = []
    refused = []

    def writer(t: int) -> None:
        for i in range(100_000):
            after = gone.is_set()
            try:
                lsn = db.put(b"t%d-%06d" % (t, i), b"x" * 100)
            except StoreVanishedError:
                refused.append(t)
                return
            if after:
                late_acks.append(lsn)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    time.sleep(0.2)
    shutil.rmtree(path)
    gone.set()
    for th in threads:
        th.join(30)
    assert late_acks == [] and len(refused) == 8
    with pytest.raises(StoreVanishedError):
        db.close()


@pytest.mark.parametrize("sync", ["batch", "none"])
def test_not_durable_modes_refuse_within_a_flush_or_a_second(tmp_path, sync):
    """sync="batch"/"none" acknowledge before any fsync (a put promises no
    durability there), so appends check the directory at most every
    DIRECTORY_CHECK_US; "batch" also at each flush (every sync_interval ms).
    Nothing is ever published as durable after the directory vanished."""
    path = str(tmp_path / "store")
    db = kvstore.open(path, sync=sync, sync_interval=20)
    db.put(b"a", b"1")
    db.sync()
    durable = db.durable_lsn
    shutil.rmtree(path)
    t0 = time.monotonic()
    with pytest.raises(StoreVanishedError) as err:
        for i in range(10_000_000):
            db.put(b"k%d" % i, b"x")
            time.sleep(0.001)
    took = time.monotonic() - t0
    limit = wal.log_writer.DIRECTORY_CHECK_US / 1e6 if sync == "none" else 0.02
    assert took < limit + 0.5, took
    _no_durability_claim(str(err.value))
    assert db.durable_lsn == durable
    with pytest.raises(StoreVanishedError):
        db.close()


def test_sync_fails_when_only_the_lock_file_is_deleted(tmp_path):
    path = str(tmp_path / "store")
    db = kvstore.open(path)
    db.put(b"a", b"1")
    os.unlink(os.path.join(path, "wal", "LOCK"))  # another writer could now lock the log
    with pytest.raises(StoreVanishedError) as err:
        db.sync()
    assert "lock file" in str(err.value)
    with pytest.raises(StoreVanishedError):
        db.close()


def test_a_store_replaced_at_the_same_path_is_not_written_by_the_old_writer(tmp_path):
    path = str(tmp_path / "store")
    db = kvstore.open(path)
    old_id = db.store_id
    db.put(b"old", b"1")
    shutil.rmtree(path)
    new_id = _make_store_in_child(path, [b"n1", b"n2"])
    assert new_id != old_id
    with pytest.raises(StoreVanishedError) as err:
        db.snapshot()
    assert "replaced" in str(err.value)
    assert not os.path.exists(os.path.join(path, "snapshots")) or not snapshot.list_snapshots(
        os.path.join(path, "snapshots"))
    with pytest.raises(StoreVanishedError):
        db.put(b"old2", b"2")
    with pytest.raises(StoreVanishedError):
        db.close()
    with kvstore.open(path) as new:
        assert new.store_id == new_id
        assert dict(new.scan()) == {b"n1": b"new", b"n2": b"new"}


def _store_with_stale_snapshot(tmp_path, old_keys: int, new_keys: int) -> tuple[str, str, str]:
    """A store at ``path`` (new id) whose snapshots/ holds a snapshot of the
    store that was there before (old id). Returns (path, old id, new id)."""
    path = str(tmp_path / "store")
    with kvstore.open(path) as old:
        for i in range(old_keys):
            old.put(b"dead%03d" % i, b"old")
        old.snapshot()
        old_id = old.store_id
    stale = str(tmp_path / "stale-snapshots")
    shutil.copytree(os.path.join(path, "snapshots"), stale)
    shutil.rmtree(path)
    new_id = _make_store_in_child(path, [b"live%03d" % i for i in range(new_keys)])
    shutil.copytree(stale, os.path.join(path, "snapshots"), dirs_exist_ok=True)
    assert old_id is not None and new_id != old_id
    return path, old_id, new_id


def test_restore_and_rebuild_skip_another_stores_snapshot(tmp_path, caplog):
    path, old_id, new_id = _store_with_stale_snapshot(tmp_path, 3, 10)
    live = {b"live%03d" % i: b"new" for i in range(10)}
    with caplog.at_level(logging.WARNING, logger="walkv.snapshots"):
        kvstore.restore(path, str(tmp_path / "restored"))
    assert old_id in caplog.text and new_id in caplog.text
    with kvstore.open(str(tmp_path / "restored")) as r:
        assert dict(r.scan()) == live
    shutil.rmtree(os.path.join(path, "lmdb"))  # the next open rebuilds LMDB
    with kvstore.open(path) as db:
        assert dict(db.scan()) == live


def test_verify_reports_another_stores_snapshot(tmp_path):
    path, old_id, new_id = _store_with_stale_snapshot(tmp_path, 3, 10)
    result = verify_store(path, Reporter(enabled=False))
    [problem] = result["problems"]
    assert problem.severity == "problem"
    assert old_id in problem.message and new_id in problem.message
    assert result["checked"]["snapshot_lsns"] == []


def test_retention_is_not_driven_by_another_stores_snapshot(tmp_path):
    # The stale snapshot (LSN 50) is newer than anything of the new store.
    path, old_id, new_id = _store_with_stale_snapshot(tmp_path, 50, 10)
    with kvstore.open(path, segment_bytes=4096) as db:
        for i in range(10, 30):
            db.put(b"live%03d" % i, b"x" * 200)
        info = db.snapshot(keep=1)
        assert info.store_id == new_id and info.lsn == 30
    with kvstore.open(path) as db:
        assert [s.lsn for s in db.list_snapshots() if s.store_id == new_id] == [30]
    shutil.rmtree(os.path.join(path, "lmdb"))  # rebuilt from this store's snapshot and log
    with kvstore.open(path) as db:
        assert len(db) == 30 and db.get(b"dead000") is None


def test_take_does_not_return_another_stores_snapshot_at_the_same_lsn(tmp_path):
    path, old_id, new_id = _store_with_stale_snapshot(tmp_path, 10, 10)
    with kvstore.open(path) as db:
        assert db.applied_lsn == 10
        info = db.snapshot()
        assert info.store_id == new_id


@pytest.mark.spark
def test_spark_state_of_a_new_store_ignores_the_old_stores_snapshot(spark, tmp_path):
    from kvstore.spark import register

    register(spark)
    path, old_id, new_id = _store_with_stale_snapshot(tmp_path, 3, 10)
    rows = (spark.read.format("walkv").option("table", "state").option("keyFormat", "string")
            .load(path).collect())
    assert sorted(r["key"] for r in rows) == ["live%03d" % i for i in range(10)]
    snap_rows = spark.read.format("walkv").option("table", "snapshot").load(path).collect()
    assert snap_rows == []
    with pytest.raises(Exception, match=old_id):
        spark.read.format("walkv").option("table", "state").option("snapshotLsn", 3).load(path).collect()
