"""Snapshots of a store, retention, rebuild from a snapshot, and point-in-time restore."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time

import pytest

import kvstore
import snapshot
from kvstore.entry.codec import decode
from kvstore.replica.restore import restore_store as restore
from wal import list_segments, read_log
from wal.errors import CorruptionError, SnapshotError, WalkvError


def model_at(store_path: str, lsn: int, base: dict[bytes, bytes] | None = None, base_lsn: int = 0
             ) -> dict[bytes, bytes]:
    """The store's contents at ``lsn``, computed from its log alone."""
    state = dict(base or {})
    for entry in read_log(os.path.join(store_path, "wal"), base_lsn + 1, lsn):
        for op in decode(entry.payload, entry.lsn):
            if op[0] == 1:
                state[op[1]] = op[2]
            elif op[0] == 2:
                state.pop(op[1], None)
            else:
                for k in [k for k in state if op[1] <= k < op[2]]:
                    del state[k]
    return state


def random_writes(db, rng: random.Random, n: int, model: dict | None = None,
                  history: dict[int, dict] | None = None) -> None:
    """``n`` random puts, deletes and range deletes; ``model`` follows them,
    and ``history[lsn]`` keeps a copy of it after each one."""
    for _ in range(n):
        r = rng.random()
        k = b"k%03d" % rng.randrange(300)
        if r < 0.75:
            v = b"v%d" % rng.randrange(10**9)
            lsn = db.put(k, v)
            if model is not None:
                model[k] = v
        elif r < 0.95:
            lsn = db.delete(k)
            if model is not None:
                model.pop(k, None)
        else:
            hi = k + b"\xff"
            lsn = db.delete_range(k, hi)
            if model is not None:
                for key in [key for key in model if k <= key < hi]:
                    del model[key]
        if history is not None:
            history[lsn] = dict(model)


def test_snapshot_is_the_state_at_its_lsn(tmp_path) -> None:
    rng = random.Random(1)
    model: dict[bytes, bytes] = {}
    with kvstore.open(tmp_path / "s", segment_bytes=8192) as db:
        random_writes(db, rng, 500, model)
        info = db.snapshot()
        assert info.lsn == db.applied_lsn == db.last_lsn
        assert dict(snapshot.open(info.path)) == model
        assert snapshot.open(info.path).store_id == db.store_id
        # No write since: the same snapshot comes back, not a new one.
        assert db.snapshot().path == info.path


def test_snapshot_during_concurrent_writes_is_consistent(tmp_path) -> None:
    path = str(tmp_path / "s")
    stop = threading.Event()
    with kvstore.open(path, segment_bytes=16384) as db:
        random_writes(db, random.Random(2), 300)

        def writer(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                random_writes(db, rng, 20)

        threads = [threading.Thread(target=writer, args=(s,)) for s in range(3)]
        for t in threads:
            t.start()
        try:
            infos = [db.snapshot(keep=10) for _ in range(3)]
        finally:
            stop.set()
            for t in threads:
                t.join()
    for i, info in enumerate(infos):
        # The snapshot equals what the log says the state was at its LSN ...
        assert dict(snapshot.open(info.path)) == model_at(path, info.lsn)
        # ... and what a point-in-time restore to that LSN builds. (Two snapshots may share an
        # LSN, when no writer got a turn between them: each restores into its own directory.)
        target = tmp_path / f"r{i}"
        restore(path, target, to_lsn=info.lsn)
        with kvstore.open(target) as r:
            assert dict(r.scan()) == model_at(path, info.lsn)


def test_point_in_time_restore_to_random_lsns(tmp_path) -> None:
    path = str(tmp_path / "s")
    rng = random.Random(3)
    model: dict[bytes, bytes] = {}
    history: dict[int, dict] = {0: {}}
    with kvstore.open(path, segment_bytes=8192, keep_snapshots=3) as db:
        random_writes(db, rng, 400, model, history)
        db.snapshot()
        random_writes(db, rng, 400, model, history)
        db.snapshot()
        random_writes(db, rng, 400, model, history)
        last = db.last_lsn
    oldest = snapshot.list_snapshots(os.path.join(path, "snapshots"))[0].lsn
    first_log = list_segments(os.path.join(path, "wal"))[0].first_lsn
    assert first_log > 1, "retention trimmed the log"
    for i, lsn in enumerate(sorted(rng.sample(range(oldest, last + 1), 6)) + [oldest, last]):
        target = tmp_path / f"r{i}"
        info = restore(path, target, to_lsn=lsn)
        assert info.lsn == lsn
        with kvstore.open(target) as r:
            assert r.applied_lsn == lsn
            assert dict(r.scan()) == history[lsn]
            # The restored store is a store like any other: it goes on.
            assert r.put(b"after", b"restore") == lsn + 1


def test_retention_keeps_log_back_to_oldest_kept_snapshot(tmp_path) -> None:
    path = str(tmp_path / "s")
    rng = random.Random(4)
    with kvstore.open(path, segment_bytes=4096, keep_snapshots=2) as db:
        lsns = []
        for _ in range(4):
            random_writes(db, rng, 300)
            lsns.append(db.snapshot().lsn)
        kept = [i.lsn for i in snapshot.list_snapshots(os.path.join(path, "snapshots"))]
        assert kept == lsns[-2:]
        first = list_segments(os.path.join(path, "wal"))[0].first_lsn
        assert first <= kept[0] + 1  # the log still reaches back to the oldest kept one
        assert first > 1  # and older segments are gone
        assert db.stats()["log"]["first_lsn"] == first


def test_restore_refuses_what_it_cannot_do(tmp_path) -> None:
    path = str(tmp_path / "s")
    with kvstore.open(path, segment_bytes=4096, keep_snapshots=1) as db:
        random_writes(db, random.Random(5), 600)
        snap_lsn = db.snapshot().lsn
        random_writes(db, random.Random(6), 100)
        last = db.last_lsn
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(WalkvError, match="not empty"):
        restore(path, tmp_path / "full")
    with pytest.raises(ValueError, match="durable only up to"):
        restore(path, tmp_path / "t1", to_lsn=last + 5)
    with pytest.raises(SnapshotError, match="cannot restore to LSN 3"):
        restore(path, tmp_path / "t2", to_lsn=3)  # before the snapshot; the log was trimmed
    with pytest.raises(WalkvError, match="neither a walkv store"):
        restore(tmp_path / "full", tmp_path / "t3")
    assert not (tmp_path / "t1").exists() and not (tmp_path / "t2").exists()
    # From one snapshot directory: its own state.
    info = restore(os.path.join(path, "snapshots", snapshot.snapshot_dir_name(snap_lsn)), tmp_path / "t4",
                   to_lsn=snap_lsn)
    assert info.lsn == snap_lsn and info.replayed == 0


def _flip_chunk_byte(snapshot_path: str, offset: int) -> None:
    """Damage one byte of the snapshot's first chunk file."""
    chunk = os.path.join(snapshot_path, snapshot.open(snapshot_path).chunks[0].name)
    with open(chunk, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


def _crash_machine(path: str) -> None:
    session = os.path.join(path, "lmdb", "SESSION")
    rec = json.load(open(session))
    rec["boot_id"] = "another-boot"
    rec["clean"] = False
    with open(session, "w") as f:
        json.dump(rec, f)


def test_machine_crash_rebuilds_from_snapshot_plus_log(tmp_path) -> None:
    path = str(tmp_path / "s")
    model: dict[bytes, bytes] = {}
    rng = random.Random(7)
    with kvstore.open(path, segment_bytes=4096) as db:
        random_writes(db, rng, 500, model)
        snap = db.snapshot()
        random_writes(db, rng, 200, model)
    _crash_machine(path)
    with kvstore.open(path) as db:
        assert db.rebuilt is not None
        assert db.replayed == db.last_lsn - snap.lsn  # only the log after the snapshot
        assert dict(db.scan()) == model


def test_broken_newest_snapshot_falls_back_to_previous(tmp_path, caplog) -> None:
    path = str(tmp_path / "s")
    model: dict[bytes, bytes] = {}
    rng = random.Random(8)
    with kvstore.open(path, segment_bytes=4096, keep_snapshots=2) as db:
        random_writes(db, rng, 400, model)
        db.snapshot()
        random_writes(db, rng, 400, model)
        newest = db.snapshot()
        random_writes(db, rng, 50, model)
    _flip_chunk_byte(newest.path, 100)
    _crash_machine(path)
    with caplog.at_level(logging.WARNING):
        with kvstore.open(path) as db:
            assert dict(db.scan()) == model
    assert any("falling back" in r.getMessage() for r in caplog.records)


def test_rebuild_refuses_when_no_snapshot_reaches_the_log(tmp_path) -> None:
    path = str(tmp_path / "s")
    with kvstore.open(path, segment_bytes=4096, keep_snapshots=1) as db:
        random_writes(db, random.Random(9), 600)
        info = db.snapshot()
        random_writes(db, random.Random(10), 50)
    os.rename(info.path, info.path + ".gone")  # the only snapshot is lost
    _crash_machine(path)
    with pytest.raises(CorruptionError, match="cannot rebuild the state"):
        kvstore.open(path)


def test_auto_snapshots_keep_the_log_bounded(tmp_path) -> None:
    path = str(tmp_path / "s")
    rng = random.Random(11)
    every = 16 << 10
    with kvstore.open(path, sync="none", segment_bytes=4096, snapshot_every_bytes=every,
                      keep_snapshots=2) as db:
        sizes = []
        for _ in range(40):
            random_writes(db, rng, 300)
            db.wait_for_snapshots()
            wal_dir = os.path.join(path, "wal")
            sizes.append(sum(os.path.getsize(os.path.join(wal_dir, n)) for n in os.listdir(wal_dir)
                             if n.endswith(".wal")))
        assert db.stats()["auto_snapshots"] >= 5
        written = db.stats()["log"]["bytes"]
    # Kept: about two snapshot intervals (keep_snapshots=2), a segment, and
    # the active segment's preallocated block, however much was written.
    bound = 3 * every + 2 * 4096 + 32768
    assert written > 3 * bound
    assert max(sizes[10:]) < bound, sizes


def test_snapshot_never_claims_an_lsn_the_log_has_not_made_durable(tmp_path) -> None:
    """sync="none": the state runs ahead of the durable log; a snapshot at
    LSN n must find the log durable up to n (or a machine crash would let the
    log hand out LSNs the snapshot already holds)."""
    path = str(tmp_path / "s")
    stop = threading.Event()
    with kvstore.open(path, sync="none", segment_bytes=1 << 20) as db:
        def writer() -> None:
            rng = random.Random(12)
            while not stop.is_set():
                random_writes(db, rng, 50)

        t = threading.Thread(target=writer)
        t.start()
        try:
            for _ in range(5):
                info = db.snapshot(keep=10)
                assert db.durable_lsn >= info.lsn
        finally:
            stop.set()
            t.join()


def test_a_snapshot_does_not_deadlock_with_a_writer_growing_the_map(tmp_path) -> None:
    """A snapshot reads from a view that holds off growth of LMDB's map, then
    (sync="none") makes the log durable up to its LSN, which waits for the
    group being written. When that group's writer is growing the map, it waits
    for the view: the snapshot must have released the view by then (it did
    not, and both waited forever). Here the writer starts while the snapshot
    reads, and the snapshot goes on once the writer waits for the view."""
    db = kvstore.open(str(tmp_path / "s"), sync="none", map_size=1 << 20)
    for i in range(2000):
        db.put(b"k%05d" % i, b"v" * 100)
    gate = db._state.lmdb.gate
    big = b"x" * (4 << 20)  # more than the map holds: the writer must grow it
    result: dict[str, object] = {}

    def write_big() -> None:
        result["lsn"] = db.put(b"big", big)

    writer = threading.Thread(target=write_big, daemon=True)

    def progress(done: int, total: int) -> None:
        if writer.ident is None:  # the first call: the view is open, the pairs half read
            writer.start()
            deadline = time.monotonic() + 60
            while not gate.blocking:  # the writer waits for readers to leave LMDB
                assert writer.is_alive() and time.monotonic() < deadline, "the writer never waited for the view"
                time.sleep(0.001)

    def snap() -> None:
        result["info"] = db.snapshot(chunk_bytes=16 << 10, progress=progress)

    snapshotter = threading.Thread(target=snap, daemon=True)
    snapshotter.start()
    for t in (snapshotter, writer):
        t.join(120)  # a liveness bound, not a timing assertion: a deadlock never ends
    if snapshotter.is_alive() or writer.is_alive():
        pytest.fail("the snapshot and the writer deadlocked (the store is left open)")
    info = result["info"]
    assert info.lsn == 2000 and info.count == 2000 and db.durable_lsn >= info.lsn
    assert result["lsn"] == 2001 and db.get(b"big") == big
    db.close()


def test_rebuild_replays_the_whole_log_when_no_snapshot_is_usable(tmp_path) -> None:
    path = str(tmp_path / "s")
    model: dict[bytes, bytes] = {}
    with kvstore.open(path, segment_bytes=1 << 20) as db:  # one segment: the log starts at LSN 1
        random_writes(db, random.Random(13), 300, model)
        info = db.snapshot()
        random_writes(db, random.Random(14), 50, model)
    _flip_chunk_byte(info.path, 60)
    _crash_machine(path)
    with kvstore.open(path) as db:
        assert db.replayed == db.last_lsn  # the whole log, from LSN 1
        assert dict(db.scan()) == model
