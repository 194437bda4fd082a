"""A reader killed in the middle of a scan must not pin LMDB's pages for
good (issue 16, item 2): a real read-only process, a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import kvstore
from kvstore.layout import LMDB_DIR

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCANNER = """
import sys, time, kvstore
db = kvstore.open(sys.argv[1], readonly=True)
it = db.scan()
next(it)
print("scanning", flush=True)
time.sleep(600)
"""


def _overwrite(db: kvstore.KVStore, rounds: int = 100, keys: int = 300) -> None:
    for r in range(rounds):
        with db.batch() as b:
            for i in range(keys):
                b.put(b"key%05d" % i, bytes([r % 256]) * 1000)


def _lmdb_bytes(path: str) -> int:
    return os.path.getsize(os.path.join(path, LMDB_DIR, "data.mdb"))


def _store(path: str) -> kvstore.KVStore:
    db = kvstore.open(path, sync="none", map_size=1 << 20)
    _overwrite(db, rounds=1)
    return db


def test_a_reader_killed_mid_scan_does_not_make_lmdb_grow(tmp_path):
    base = str(tmp_path / "base")
    with _store(base) as db:
        _overwrite(db)
    baseline = _lmdb_bytes(base)

    path = str(tmp_path / "victim")
    with _store(path) as db:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        child = subprocess.Popen([sys.executable, "-c", SCANNER, path], stdout=subprocess.PIPE, env=env)
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == b"scanning"
            assert db.stats()["lmdb_reader_slots"] >= 1
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()  # type: ignore[union-attr]
        _overwrite(db)
        st = db.stats()
    grown = _lmdb_bytes(path)
    assert grown < 10 * baseline, (grown, baseline)
    assert st["lmdb_oldest_reader_lag"] is None or st["lmdb_oldest_reader_lag"] < 100


def test_a_long_scan_renews_its_snapshot_between_chunks(tmp_path, monkeypatch):
    import kvstore.state.readers as readers

    with kvstore.open(str(tmp_path / "s"), sync="none") as db:
        db.update((b"k%03d" % i, b"old") for i in range(100))
        monkeypatch.setattr(readers, "SCAN_HOLD_SECONDS", 1e9)
        it = db.scan()
        first = [next(it) for _ in range(20)]
        db.put(b"k090", b"new")
        held = dict(first + list(it))
        assert held[b"k090"] == b"old"  # a short scan is one snapshot

        monkeypatch.setattr(readers, "SCAN_HOLD_SECONDS", 0.0)  # every chunk renews
        it = db.scan()
        first = [next(it) for _ in range(20)]
        assert db.stats()["lmdb_readers_reading"] >= 2  # the scan's snapshot (and stats' own)
        db.put(b"k091", b"new")
        db.put(b"k005", b"new")  # behind the scan: not seen again
        rest = list(it)
        pairs = first + rest
        assert [k for k, _ in pairs] == [b"k%03d" % i for i in range(100)]  # once each, in order
        assert dict(pairs)[b"k091"] == b"new" and dict(pairs)[b"k005"] == b"old"
        assert db.stats()["lmdb_readers_reading"] == 1  # the scan let go of its snapshot
