"""The overlay (kvstore/state/overlay.py): small groups of a store opened with
sync="none"/"batch" are applied in memory and written to LMDB in bulk. What
must hold: every write is visible to the next read in any thread at once; LMDB
catches up (flush on size, on time, before scans/views/counts/snapshots, at
close); a process crash loses nothing acknowledged (the log replays what LMDB
missed); a read-only process beside the writer catches up; a failed flush
fails the log instead of losing writes; get_many answers as get does."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvstore
from kvstore.state import overlay as overlay_mod
from tests.test_kvstore import ROOT, abandon
from wal.errors import DiskFullError, LogFailedError


def lmdb_value(db: kvstore.KVStore, key: bytes) -> bytes | None:
    """What LMDB itself holds for ``key`` (no overlay)."""
    env = db._state.lmdb
    with env.env.begin(db=env.data_db) as txn:
        return txn.get(key)


def test_a_write_is_visible_at_once_and_reaches_lmdb_in_bulk(tmp_path, monkeypatch):
    monkeypatch.setattr(overlay_mod, "FLUSH_SECONDS", 3600.0)  # only size and reads flush here
    with kvstore.open(str(tmp_path / "s"), sync="none") as db:
        db.put(b"old", b"1")
        db.delete(b"old")
        db.put(b"a", b"1")
        state = db._state
        assert db.get(b"a") == b"1" and db.get(b"old") is None and db[b"a"] == b"1"
        assert lmdb_value(db, b"a") is None and state.commits.applied_lsn == 0 < db.applied_lsn == 3
        got: list = []
        t = threading.Thread(target=lambda: got.append(db.get(b"a")))
        t.start()
        t.join()
        assert got == [b"1"]  # any thread
        assert len(db) == 1   # a count flushes first
        assert lmdb_value(db, b"a") == b"1" and state.commits.applied_lsn == 3
        assert db.stats()["overlay_keys"] == 0


def test_an_empty_overlay_is_not_looked_at(tmp_path, monkeypatch):
    """While the overlay is empty a get goes straight to LMDB; the first
    write switches gets to the overlay before it returns, a flush that
    empties it switches them back, and a write during a flush keeps them on
    the overlay (so no write is missed whichever way the switch races)."""
    monkeypatch.setattr(overlay_mod, "FLUSH_SECONDS", 3600.0)
    with kvstore.open(str(tmp_path / "s"), sync="none") as db:
        state = db._state
        reads = state._reads
        assert state.get == reads.get_lmdb
        db.put(b"a", b"1")
        assert state.get == reads.get and db.get(b"a") == b"1"
        state.flush()
        assert state.get == reads.get_lmdb and db.get(b"a") == b"1"
        db.put(b"b", b"2")
        real_write = state.lmdb.write

        def write_then_put(fn):  # a put arrives while the flush writes LMDB
            real_write(fn)
            monkeypatch.setattr(state.lmdb, "write", real_write)
            db.put(b"c", b"3")
        monkeypatch.setattr(state.lmdb, "write", write_then_put)
        state.flush()
        assert state.get == reads.get and db.get(b"c") == b"3" and db.get(b"b") == b"2"
        assert lmdb_value(db, b"b") == b"2" and lmdb_value(db, b"c") is None


def test_a_full_overlay_is_flushed_by_the_writer(tmp_path, monkeypatch):
    monkeypatch.setattr(overlay_mod, "FLUSH_SECONDS", 3600.0)
    monkeypatch.setattr(overlay_mod, "MAX_KEYS", 10)
    with kvstore.open(str(tmp_path / "s"), sync="none") as db:
        for i in range(25):
            db.put(b"k%02d" % i, b"v")
        assert db._state.overlay.flushes == 2 and db._state.commits.applied_lsn == 20
        assert lmdb_value(db, b"k19") == b"v" and lmdb_value(db, b"k20") is None
        assert db.get(b"k24") == b"v"


def test_the_flushing_thread_catches_lmdb_up(tmp_path, monkeypatch):
    monkeypatch.setattr(overlay_mod, "FLUSH_SECONDS", 0.01)
    with kvstore.open(str(tmp_path / "s"), sync="none") as db:
        db.put(b"a", b"1")
        db.put(b"b", b"2")
        deadline = time.monotonic() + 60
        while db._state.commits.applied_lsn < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert lmdb_value(db, b"b") == b"2" and db._state.commits.applied_lsn == 2  # with no read asking


def test_a_due_flush_is_handed_to_the_writers_next_put(tmp_path, monkeypatch):
    # The thread marks the flush due and then waits an hour for the writer:
    # only the writer's own next put can have flushed what the overlay held.
    monkeypatch.setattr(overlay_mod, "FLUSH_SECONDS", 0.01)
    monkeypatch.setattr(overlay_mod, "HANDOFF_SECONDS", 3600.0)
    with kvstore.open(str(tmp_path / "s"), sync="none") as db:
        overlay = db._state.overlay
        db.put(b"a", b"1")
        deadline = time.monotonic() + 60
        while not overlay.due and time.monotonic() < deadline:
            time.sleep(0.005)
        assert overlay.due and overlay.flushes == 0 and db._state.commits.applied_lsn == 0
        db.put(b"b", b"2")
        assert overlay.flushes == 1 and not overlay.due and len(overlay) == 0
        assert db._state.commits.applied_lsn == 2 and lmdb_value(db, b"a") == b"1" and lmdb_value(db, b"b") == b"2"


def test_groups_that_are_not_plain_puts_apply_after_the_overlay(tmp_path, monkeypatch):
    monkeypatch.setattr(overlay_mod, "FLUSH_SECONDS", 3600.0)
    with kvstore.open(str(tmp_path / "s"), sync="none") as db:
        db.put(b"k1", b"a")
        db.delete_range(b"k", b"l")   # must see k1, which is only in the overlay
        db.put(b"k2", b"b")
        assert db.compare_and_set(b"k2", b"b", b"c")  # decided against the overlay
        assert not db.compare_and_set(b"k1", b"a", b"x")
        assert [db.get(b"k1"), db.get(b"k2")] == [None, b"c"]
        assert dict(db.scan()) == {b"k2": b"c"}


def test_a_process_crash_loses_nothing_the_overlay_held(tmp_path, monkeypatch):
    monkeypatch.setattr(overlay_mod, "FLUSH_SECONDS", 3600.0)
    path = str(tmp_path / "s")
    db = kvstore.open(path, sync="none")
    db.update({b"base%d" % i: b"0" for i in range(10)})
    assert len(db) == 10  # (a count flushes the overlay: LMDB holds LSN 1)
    for i in range(100):
        db.put(b"k%03d" % i, b"%d" % i)
    db.delete(b"base3")
    assert db._state.commits.applied_lsn == 1 and db.last_lsn == 102
    abandon(db)  # the overlay is gone with the process; LMDB stayed at LSN 1
    with kvstore.open(path, sync="none") as db:
        assert db.rebuilt is None and db.replayed == 101
        assert db.get(b"k099") == b"99" and db.get(b"base3") is None and len(db) == 109


def test_a_killed_writer_loses_nothing_acknowledged(tmp_path):
    path = str(tmp_path / "s")
    code = """
import sys, kvstore
db = kvstore.open(sys.argv[1], sync="none")
for i in range(3000):
    db.put(b"k%05d" % i, b"%d" % i)
    if i == 2000:
        print("acked", flush=True)
print("done", flush=True)
sys.stdin.readline()
"""
    p = subprocess.Popen([sys.executable, "-c", code, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, cwd=ROOT)
    try:
        assert p.stdout.readline().strip() == "acked"  # type: ignore[union-attr]
        assert p.stdout.readline().strip() == "done"   # type: ignore[union-attr]
        p.kill()  # SIGKILL: whatever the overlay held dies with it
        p.wait(60)
    finally:
        p.kill()
    with kvstore.open(path) as db:
        assert [db.get(b"k%05d" % i) for i in range(3000)] == [b"%d" % i for i in range(3000)]


READER = """
import sys, time, kvstore
db = kvstore.open(sys.argv[1], readonly=True)
print("ready", flush=True)
sys.stdin.readline()
deadline = time.monotonic() + 60
while db.get(b"late") is None and time.monotonic() < deadline:
    time.sleep(0.01)
print(db.get(b"late"), db.applied_lsn, flush=True)
"""


def test_a_readonly_process_catches_up_with_the_overlay(tmp_path):
    path = str(tmp_path / "s")
    with kvstore.open(path, sync="none") as db:
        db.put(b"early", b"1")
        p = subprocess.Popen([sys.executable, "-c", READER, path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            assert p.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
            db.put(b"late", b"2")  # in the overlay; LMDB has it within FLUSH_SECONDS
            out, _ = p.communicate("go\n", timeout=120)
        finally:
            p.kill()
        assert out.split() == ["b'2'", "2"]


def test_a_failed_flush_fails_the_log_and_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(overlay_mod, "FLUSH_SECONDS", 3600.0)
    monkeypatch.setattr(overlay_mod, "MAX_KEYS", 5)
    path = str(tmp_path / "s")
    db = kvstore.open(path, sync="none")
    state = db._state
    real = state.lmdb.write

    def full(fn) -> None:
        raise DiskFullError("no space (injected)")
    monkeypatch.setattr(state.lmdb, "write", full)
    acked = []
    with pytest.raises(DiskFullError):
        for i in range(20):
            db.put(b"k%02d" % i, b"v")  # the 5th fills the overlay: its flush fails
            acked.append(i)
    assert acked == list(range(4))  # the 5th raised: its entry is in the log, not acknowledged
    with pytest.raises(LogFailedError):  # and the log refuses from here on
        db.put(b"more", b"x")
    assert db.get(b"k03") == b"v"  # what was applied is still read
    monkeypatch.setattr(state.lmdb, "write", real)
    db.close()
    with kvstore.open(path, sync="none") as db:
        assert [db.get(b"k%02d" % i) for i in range(5)] == [b"v"] * 5 and db.get(b"k05") is None


def test_readers_never_see_a_write_go_back_while_flushes_run(tmp_path, monkeypatch):
    """One writer bumps counters; readers in other threads check that each
    counter never decreases, across overlay swaps and LMDB commits (a read
    that fell between the frozen dictionary and a stale LMDB snapshot would
    see an older value)."""
    monkeypatch.setattr(overlay_mod, "MAX_KEYS", 300)
    with kvstore.open(str(tmp_path / "s"), sync="none") as db:
        keys = [b"c%04d" % i for i in range(1000)]
        stop = threading.Event()
        errors: list[str] = []

        def read() -> None:
            seen = dict.fromkeys(keys, -1)
            while not stop.is_set():
                for k, v in zip(keys, db.get_many(keys)):
                    n = -1 if v is None else int(v)
                    if n < seen[k]:
                        errors.append(f"{k!r} went back from {seen[k]} to {n}")
                    seen[k] = n
                for k in keys:
                    v = db.get(k)
                    n = -1 if v is None else int(v)
                    if n < seen[k]:
                        errors.append(f"{k!r} went back from {seen[k]} to {n}")
                    seen[k] = n

        readers = [threading.Thread(target=read) for _ in range(2)]
        for t in readers:
            t.start()
        try:
            for n in range(30000):
                db.put(keys[n % 1000], b"%d" % n)
        finally:
            stop.set()
            for t in readers:
                t.join()
        assert not errors, errors[:5]
        assert db._state.overlay.flushes >= 90


keys = st.binary(min_size=1, max_size=2)
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), keys, st.binary(max_size=6)),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("flush")),
    st.tuples(st.just("range"), keys, keys),
), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops, probes=st.lists(keys, max_size=20))
def test_reads_match_a_model_whatever_the_overlay_holds(tmp_path_factory, ops, probes):
    path = str(tmp_path_factory.mktemp("m") / "s")
    model: dict[bytes, bytes] = {}
    with kvstore.open(path, sync="none") as db:
        for op in ops:
            if op[0] == "put":
                db.put(op[1], op[2])
                model[op[1]] = op[2]
            elif op[0] == "delete":
                db.delete(op[1])
                model.pop(op[1], None)
            elif op[0] == "range":
                db.delete_range(op[1], op[2])
                for k in [k for k in model if op[1] <= k < op[2]]:
                    del model[k]
            else:
                db._state.flush()
        probes = probes + list(model)
        assert db.get_many(probes, b"-") == [model.get(k, b"-") for k in probes]
        assert [db.get(k) for k in probes] == [model.get(k) for k in probes]
        assert dict(db.scan()) == model
    with kvstore.open(path, sync="none") as db:
        assert dict(db.scan()) == model and db.replayed == 0


def test_get_many_in_chunks_types_and_closed(tmp_path):
    with kvstore.open(str(tmp_path / "s")) as db:
        db.update({b"k%05d" % i: b"%d" % i for i in range(3000)})
        want = [b"k%05d" % i for i in range(0, 6000, 2)]
        assert db.get_many(want) == [b"%d" % i if i < 3000 else None for i in range(0, 6000, 2)]
        assert db.get_many([bytearray(b"k00001"), memoryview(b"k00002"), b"", b"x" * 600]) == \
            [b"1", b"2", None, None]
        with pytest.raises(TypeError, match="encode"):
            db.get_many([b"k00001", "k00002"])  # type: ignore[list-item]
        with db.view() as v:
            assert v.get_many([b"k00003", b"nope"], b"?") == [b"3", b"?"]
    with pytest.raises(kvstore.ClosedError):
        db.get_many([b"k00001"])
